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


def test_rephrased_knowledge_is_ptx_data(tmp_path, tiny_qwen2_dir) -> None:
    """`k2post rephrase` output (text rows) mixed with chat rows: `ptx_domains: [rephrase]` trains on the documents'
    every token, what configs/rl_ptx_rephrased.yaml sets up."""
    import json

    from datasets import Dataset, load_from_disk

    from k2post.config.registry import load_run_config
    from k2post.models.loading import load_tokenizer
    from k2post.rephrase.pipeline import run_rephrase
    from k2post.rl.ptx_rows import load_ptx_rows

    rephrase = load_run_config(
        "configs/rephrase_demo.yaml", [f"out_dir={tmp_path / 'r'}", "input.synthetic_entities=6"]
    )
    run_rephrase(rephrase)
    rows = load_from_disk(str(tmp_path / "r" / "dataset")).to_list()
    chat = {"id": "chat0", "domain": "gym:math", "messages": json.dumps([
        {"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}])}  # fmt: skip
    mixed = [{"id": r["id"], "text": r["text"], "domain": r["domain"]} for r in rows] + [chat]
    Dataset.from_list(mixed).save_to_disk(str(tmp_path / "mix"))
    rl = load_run_config("configs/rl_ptx_rephrased.yaml", [f"loss.ptx_data={tmp_path / 'mix'}"])
    packed = load_ptx_rows(rl.loss, load_tokenizer(tiny_qwen2_dir), max_seq_len=512, seed=0)
    assert len(packed) == len(rows) == 6 * 4  # 6 documents: the original + 3 rewrites each; the chat row left out
    tokenizer = load_tokenizer(tiny_qwen2_dir)
    assert {tokenizer.decode(r.input_ids[:-1]) for r in packed} == {r["text"] for r in rows}
    assert all(sum(label != -100 for label in r.labels) == len(r.input_ids) - 1 for r in packed)  # every next token
