"""The lr schedule SFT and RL share: a table of lr factors, and the step range it accepts."""

from __future__ import annotations

import math

import pytest

from k2post.train.config import LRScheduleConfig
from k2post.train.schedule import lr_factor


@pytest.mark.parametrize(
    "schedule, warmup, step, total, expected",
    [
        ("constant", 0, 0, 10, 1.0),
        ("constant", 4, 0, 10, 0.25),
        ("constant", 4, 3, 10, 1.0),
        ("constant", 4, 9, 10, 1.0),
        ("cosine", 0, 0, 10, 1.0),
        ("cosine", 0, 5, 10, 0.1 + 0.9 * 0.5),
        ("cosine", 2, 1, 10, 1.0),
        ("cosine", 2, 2, 10, 1.0),
        ("cosine", 2, 6, 10, 0.1 + 0.9 * 0.5),
        ("cosine", 0, 9, 10, 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.9))),
    ],
)
def test_lr_factor_table(schedule, warmup, step, total, expected):
    cfg = LRScheduleConfig(kind=schedule, warmup_steps=warmup, min_lr_ratio=0.1)
    assert lr_factor(step, total, cfg) == pytest.approx(expected)


def test_lr_factor_outside_the_run():
    with pytest.raises(ValueError, match="outside the run's steps"):
        lr_factor(10, 10, LRScheduleConfig())
