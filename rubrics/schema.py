"""The shipped rubric files (`rubrics/data/<kind>.yaml`) and `builtin_rubrics`; the `Rubric` model, rubric-file
loading and task rubrics are core (`k2post.judging.rubric`), shared with the critic's closed loop.

    rubrics = builtin_rubrics()                       # core + prescriptive, in file order
    rubrics += task_rubrics(task)                     # Task, or a dataset-row dict
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

from k2post.judging.rubric import RUBRIC_KINDS, Rubric, RubricFileError, load_rubric_file, task_rubrics

DATA_DIR = Path(__file__).resolve().parent / "data"
"""Folder of the shipped rubric files, one `<kind>.yaml` per shipped kind."""

__all__ = [
    "DATA_DIR",
    "RUBRIC_KINDS",
    "Rubric",
    "RubricFileError",
    "builtin_rubrics",
    "load_rubric_file",
    "task_rubrics",
]


@lru_cache(maxsize=None)
def _builtin(kind: str) -> tuple[Rubric, ...]:
    """The shipped rubrics of one kind (read once per process)."""
    rubrics = load_rubric_file(DATA_DIR / f"{kind}.yaml")
    if any(rubric.kind != kind for rubric in rubrics):
        raise RubricFileError(f"{DATA_DIR / f'{kind}.yaml'}: kind: must be {kind!r}")
    return tuple(rubrics)


def builtin_rubrics(kinds: Iterable[str] = ("core", "prescriptive")) -> list[Rubric]:
    """The shipped rubrics of `kinds`, kind by kind; `task` ships none (see `task_rubrics`)."""
    rubrics: list[Rubric] = []
    for kind in kinds:
        if kind not in RUBRIC_KINDS:
            raise ValueError(f"unknown rubric kind {kind!r}: use one of {', '.join(RUBRIC_KINDS)}")
        if kind != "task":
            rubrics.extend(_builtin(kind))
    return rubrics
