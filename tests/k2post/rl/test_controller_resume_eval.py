"""`resume: auto`, the resume log line, and the pre-RL eval switch and its early stop on scorer errors, on the
controller's in-process fakes (tests/k2post/rl/rl_fakes.py)."""

from __future__ import annotations

import logging
import types

import pytest

from k2post.config.loader import ConfigError
from k2post.envs.reward_errors import RewardErrorsExceeded
from k2post.rl.controller import score_in_chunks
from k2post.rl.metrics import read_metrics
from test_controller import VOLATILE, _config, _run


def _stable(rows):
    return [{k: v for k, v in row.items() if not k.startswith(VOLATILE)} for row in rows]


def test_resume_auto_starts_fresh_then_the_same_config_continues_the_run(tmp_path, caplog):
    whole, _ = _run(_config(tmp_path / "a"))
    caplog.set_level(logging.INFO, logger="k2post")
    _run(_config(tmp_path / "b", resume="auto", train={"stop_at_iteration": 2}))  # a preempted first attempt
    assert "no checkpoint in" in caplog.text
    caplog.clear()
    resumed, _ = _run(_config(tmp_path / "b", resume="auto"))  # the job resubmitted
    checkpoint = tmp_path / "b" / "run" / "checkpoints" / "iter-2"
    assert f"rl: resuming from {checkpoint} (iteration 2)" in caplog.text
    first, second = (read_metrics(tmp_path / d / "run" / "metrics.jsonl") for d in ("a", "b"))
    assert _stable(second) == _stable(first) and resumed["optimizer_steps"] == whole["optimizer_steps"]


@pytest.mark.parametrize("value, expected", [(False, False), (True, True), ("auto", "auto"), ("sometimes", None)])
def test_resume_is_false_true_or_auto(tmp_path, value, expected):
    if expected is None:
        with pytest.raises(ConfigError, match="resume"):
            _config(tmp_path, resume=value)
    else:
        assert _config(tmp_path, resume=value).resume == expected


@pytest.mark.parametrize("at_start, first_iteration", [(True, 0), (False, 1)])
def test_the_pre_rl_eval_can_be_switched_off(tmp_path, at_start, first_iteration):
    _run(_config(tmp_path, train={"eval_at_start": at_start}))
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert rows[0]["iteration"] == first_iteration and "eval/mean_accuracy" in rows[-1]


def _rewards(errors: str):
    return [types.SimpleNamespace(error="boom" if e == "x" else None) for e in errors]


@pytest.mark.parametrize(
    "outcomes, chunk, limit, scored",
    [
        ("." * 10, 4, 0.5, 10),  # no errors: everything scored
        ("xxxx" + "." * 28, 4, 0.5, 4),  # the first chunk all errors: stops after it
        (".." + "xx" + "." * 28, 4, 0.5, 32),  # 2 of 4 is not more than half: goes on, then recovers
        ("x..." + "xxxx" + "x" * 8, 4, 0.5, 8),  # 1 of 4 goes on, then 5 of 8: stops after the second chunk
        ("x" * 12, 4, 1.0, 12),  # 1.0: never stops
    ],
)
def test_eval_scoring_stops_early_when_scorer_errors_pile_up(outcomes, chunk, limit, scored):
    calls = []

    def score(items):
        calls.append(len(items))
        return _rewards("".join(outcomes[i] for i in items))

    items, names = list(range(len(outcomes))), ["math"] * len(outcomes)
    if scored < len(outcomes):
        with pytest.raises(RewardErrorsExceeded, match=r"pre-RL eval: \d+ of \d+ rewards failed.*first: math: boom"):
            score_in_chunks(score, items, names, chunk, limit, "pre-RL eval")
    else:
        assert len(score_in_chunks(score, items, names, chunk, limit, "pre-RL eval")) == scored
    assert sum(calls) == scored
