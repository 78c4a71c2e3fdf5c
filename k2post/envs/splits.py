"""Task splits shared by every environment, and the helpers environments use to keep them apart.

    train    RL prompts and SFT data (synthesis draws gym tasks from train only)
    dev      choosing settings (hyper-parameters, checkpoints) without touching the report
    test     the held-out report (`k2post eval --split test`, the default)
    shifted  a held-out distribution shift no config trains on (more terms, larger numbers,
             unseen templates): generalization, not a tuning target

train / dev / test are disjoint by content (question text, prompt + initial state), not just id,
and deterministic; `shifted` is disjoint from train. An environment without a shift raises
`unsupported_split(...)`: one line naming the environment and the split.

    hash_split("task-17", test_fraction=0.2, dev_fraction=0.1)   # "train" | "dev" | "test"
"""

from __future__ import annotations

import hashlib
from typing import Literal, get_args

Split = Literal["train", "dev", "test", "shifted"]
SPLITS: tuple[str, ...] = get_args(Split)
BASE_SPLITS: tuple[str, ...] = ("train", "dev", "test")
"""The splits every environment supports."""


def hash_bucket(key: str) -> float:
    """A stable number in [0, 1) from a string (sha256), the same in every process and run."""
    return int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:8], 16) / 0x1_0000_0000


def split_of_bucket(bucket: float, test_fraction: float, dev_fraction: float) -> Literal["train", "dev", "test"]:
    """test below test_fraction, dev in the next dev_fraction, train above."""
    if bucket < test_fraction:
        return "test"
    return "dev" if bucket < test_fraction + dev_fraction else "train"


def hash_split(key: str, test_fraction: float, dev_fraction: float) -> Literal["train", "dev", "test"]:
    """The split of a key (id or content) by its hash: see `split_of_bucket`."""
    return split_of_bucket(hash_bucket(key), test_fraction, dev_fraction)


def every_split(index: int, test_every: int) -> Literal["train", "dev", "test"]:
    """Split of item `index` of a small fixed file: every test_every-th item (0, k, 2k, ...) is test,
    the item after each (1, k+1, ...) is dev when test_every >= 3, the others are train."""
    remainder = index % test_every
    if remainder == 0:
        return "test"
    return "dev" if remainder == 1 and test_every >= 3 else "train"


def unsupported_split(env_name: str, split: str) -> ValueError:
    """The one-line error for a split an environment does not have."""
    if split not in SPLITS:
        return ValueError(f"{env_name}: unknown split {split!r} (known: {', '.join(SPLITS)})")
    return ValueError(
        f"{env_name}: split {split!r} is not supported by this environment (use one of: {', '.join(BASE_SPLITS)})"
    )


def check_split(env_name: str, split: str, supported: tuple[str, ...] = BASE_SPLITS) -> str:
    """`split` when the environment supports it, else raise `unsupported_split`."""
    if split not in supported:
        raise unsupported_split(env_name, split)
    return split


__all__ = [
    "BASE_SPLITS",
    "SPLITS",
    "Split",
    "check_split",
    "every_split",
    "hash_bucket",
    "hash_split",
    "split_of_bucket",
    "unsupported_split",
]
