"""Which curated rows the PTX loss trains on, and in what order.

`select_ptx_rows` is a pure function: it keeps the examples whose dataset row has one of the
chosen `domain` values (all rows when none are chosen) and shuffles them with the run's seed,
so each optimizer step's PTX batch is a sample of the whole selection, not the dataset's first
rows (`k2post synth` writes its tool trajectories before its gym rows).

    rows = select_ptx_rows(examples, row_domains=["calculator", "gym:math"], domains=["gym:math"], seed=0)
    packed = load_ptx_rows(cfg.loss, tokenizer, max_seq_len=2048, seed=0)   # what the RL trainer trains on

The PTX data is any SFT dataset (k2post.sft.sources): chat rows, or text rows such as `k2post rephrase`'s
rephrased knowledge documents (every token trained; `loss.ptx_domains: [rephrase]` picks them in a mix).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, TypeVar

from k2post.sft.packing import Example

E = TypeVar("E", bound=Example)


class PTXDataError(ValueError):
    """The PTX selection is empty or names a domain the dataset does not have."""


def select_ptx_rows(examples: Sequence[E], row_domains: Sequence[str], domains: Sequence[str], seed: int) -> list[E]:
    """The examples whose row's domain is in `domains` (all when empty), in a seeded random order."""
    present = sorted(set(row_domains))
    missing = [name for name in domains if name not in present]
    if missing:
        raise PTXDataError(f"loss.ptx_domains {missing} not in the PTX data (its domains: {present})")
    keep = set(domains)
    chosen = [ex for ex in examples if not keep or row_domains[ex.row_index] in keep]
    if not chosen:
        raise PTXDataError(f"loss.ptx_domains {list(domains)} selects no usable PTX row")
    random.Random(seed).shuffle(chosen)
    return chosen


def ptx_row_domains(path: str, rows: int) -> list[str]:
    """The `domain` of each of the first `rows` rows of the dataset at `path` ("" where it has none)."""
    from k2post.sft.sources import open_dataset

    return [str(row.get("domain") or "") for row in open_dataset(path, rows)]


def load_ptx_rows(loss: Any, tokenizer: Any, max_seq_len: int, seed: int) -> list[Any]:
    """The PTX rows one trainer rank trains on: `loss.ptx_data` read as SFT data (chat or text rows, no held-out
    split, one example per row), the `loss.ptx_domains` selection in a seeded order, one packed row each."""
    from k2post.sft.config import SFTDataConfig
    from k2post.sft.data import load_sft_data
    from k2post.sft.packing import pack_examples

    data_cfg = SFTDataConfig(path=loss.ptx_data, eval_fraction=0.0, packing=False, max_seq_len=max_seq_len)
    data = load_sft_data(data_cfg, tokenizer)
    if not data.train:
        raise PTXDataError(f"loss.ptx_data {loss.ptx_data!r} has no usable rows")
    row_domains = ptx_row_domains(loss.ptx_data, data.report.rows)
    chosen = select_ptx_rows(data.train, row_domains, loss.ptx_domains, seed)
    return pack_examples(chosen, data_cfg.max_seq_len, False)
