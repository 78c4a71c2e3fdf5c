"""Which rows the PTX loss trains on: domain filter, seeded order, clear errors."""

from __future__ import annotations

import pytest

from k2post.rl.ptx_rows import PTXDataError, ptx_row_domains, select_ptx_rows
from k2post.sft.packing import Example

DOMAINS = ["calculator", "calculator", "gym:math", "gym:math", "gym:math", "bank"]


def examples(indices: list[int]) -> list[Example]:
    return [Example(input_ids=(1, 2), loss_mask=(0, 1), row_index=i, id=f"row{i}") for i in indices]


@pytest.mark.parametrize(
    ("domains", "expected_rows"),
    [
        ([], {0, 1, 2, 3, 4, 5}),
        (["gym:math"], {2, 3, 4}),
        (["gym:math", "bank"], {2, 3, 4, 5}),
        (["calculator"], {0, 1}),
    ],
)
def test_selects_the_rows_of_the_chosen_domains(domains: list[str], expected_rows: set[int]) -> None:
    chosen = select_ptx_rows(examples(list(range(6))), DOMAINS, domains, seed=0)
    assert sorted(ex.row_index for ex in chosen) == sorted(expected_rows)


def test_skipped_rows_stay_out_and_the_order_follows_the_seed() -> None:
    rows = examples([0, 2, 3, 4, 5])  # row 1 was a bad row the loader skipped
    first = [ex.row_index for ex in select_ptx_rows(rows, DOMAINS, [], seed=0)]
    again = [ex.row_index for ex in select_ptx_rows(rows, DOMAINS, [], seed=0)]
    orders = {tuple(ex.row_index for ex in select_ptx_rows(rows, DOMAINS, [], seed=s)) for s in range(8)}
    assert first == again and sorted(first) == [0, 2, 3, 4, 5]
    assert len(orders) > 1  # the seed moves the order; the dataset's own order is not kept


def test_a_domain_the_data_lacks_is_named() -> None:
    with pytest.raises(PTXDataError, match=r"\['code'\] not in the PTX data .*'gym:math'"):
        select_ptx_rows(examples([0, 2]), DOMAINS, ["code"], seed=0)


def test_a_domain_whose_rows_were_all_skipped_selects_nothing() -> None:
    with pytest.raises(PTXDataError, match="selects no usable PTX row"):
        select_ptx_rows(examples([0, 1, 2]), DOMAINS, ["bank"], seed=0)


def test_row_domains_read_from_the_dataset(tmp_path) -> None:
    from datasets import Dataset

    rows = {"id": ["a", "b"], "messages": [[], []], "domain": ["calculator", None]}
    Dataset.from_dict(rows).save_to_disk(str(tmp_path / "with"))
    Dataset.from_dict({k: v for k, v in rows.items() if k != "domain"}).save_to_disk(str(tmp_path / "without"))
    assert ptx_row_domains(str(tmp_path / "with"), 2) == ["calculator", ""]
    assert ptx_row_domains(str(tmp_path / "without"), 2) == ["", ""]
