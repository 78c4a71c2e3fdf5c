"""Learning-signal diagnostics of k2post.rl.diagnostics (pure) and the diagnostics plots of k2post.rl.metrics."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from k2post.rl.batch import group_advantages_of
from k2post.rl.batch import Sample
from k2post.rl.diagnostics import (
    agentic_metrics,
    group_diagnostics,
    group_has_signal,
    group_reward_std,
    nonzero_adv_fraction,
)
from k2post.rl.metrics import write_plots


@pytest.mark.parametrize(
    "rewards, tolerance, expected",
    [
        ([1.0, 1.0, 1.0, 1.0], 1e-6, False),  # all solved
        ([0.0, 0.0, 0.0, 0.0], 1e-6, False),  # none solved
        ([1.0, 0.0, 0.0, 0.0], 1e-6, True),
        ([0.5, 0.5 + 1e-9], 1e-6, False),  # float noise of shaping is no signal
        ([0.5, 0.5 + 1e-3], 1e-6, True),
        ([0.5, 0.5 + 1e-3], 1e-2, False),  # a looser tolerance
        ([1.0], 1e-6, False),  # K=1: the advantage is always 0
        ([], 1e-6, False),
    ],
)
def test_group_has_signal(rewards, tolerance, expected):
    assert group_has_signal(rewards, tolerance) is expected
    if rewards:  # agrees with the advantages the trainer gets
        assert expected == any(abs(a) > tolerance / 2 for a in group_advantages_of(rewards))


@pytest.mark.parametrize(
    "rewards, expected",
    [
        ([1.0, 1.0], 0.0),
        ([1.0, 0.0], 0.5),
        ([1.0, 0.0, 0.0, 0.0], math.sqrt(3) / 4),
        ([2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0], 2.0),  # population std
        ([3.0], 0.0),
        ([], 0.0),
    ],
)
def test_group_reward_std(rewards, expected):
    assert group_reward_std(rewards) == pytest.approx(expected)


@pytest.mark.parametrize(
    "groups, expected",
    [
        ([[1.0, 1.0], [0.0, 0.0]], 0.0),
        ([[1.0, 0.0], [0.0, 0.0]], 0.5),
        ([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.2, 0.2]], 0.5),
        ([[1.0, 0.0, 1.0]], 1.0),
    ],
)
def test_nonzero_adv_fraction(groups, expected):
    assert nonzero_adv_fraction(groups) == pytest.approx(expected)


def test_nonzero_adv_fraction_of_no_groups_is_nan():
    assert math.isnan(nonzero_adv_fraction([]))


@pytest.mark.parametrize(
    "groups, envs, expected",
    [
        ([], [], {}),
        (
            [[1.0, 1.0], [0.0, 0.0]],
            ["math", "math"],
            {
                "rollout/groups_nonzero_adv_frac": 0.0,
                "rollout/reward_std_mean": 0.0,
                "rollout/reward_std_max": 0.0,
                "rollout/groups_nonzero_adv_frac/math": 0.0,
            },
        ),
        (
            [[1.0, 0.0], [1.0, 1.0], [0.0, 1.0, 0.0, 1.0]],
            ["math", "math", "code"],
            {
                "rollout/groups_nonzero_adv_frac": 2 / 3,
                "rollout/reward_std_mean": 1 / 3,
                "rollout/reward_std_max": 0.5,
                "rollout/groups_nonzero_adv_frac/math": 0.5,
                "rollout/groups_nonzero_adv_frac/code": 1.0,
            },
        ),
    ],
)
def test_group_diagnostics(groups, envs, expected):
    row = group_diagnostics(groups, envs)
    assert row.keys() == expected.keys()
    assert row == pytest.approx(expected)


def test_group_diagnostics_rejects_mismatched_env_names():
    with pytest.raises(ValueError, match="2 groups but 1 env names"):
        group_diagnostics([[1.0, 0.0], [0.0, 0.0]], ["math"])


def _sample(env: str, reward: float, turns: int = 1, calls: int = 0, malformed: int = 0, errors: int = 0) -> Sample:
    return Sample(
        "g",
        0,
        env,
        env,
        "t",
        [1, 2],
        [0, 1],
        reward,
        False,
        "stop",
        turns=turns,
        tool_calls=calls,
        malformed_calls=malformed,
        tool_errors=errors,
    )


@pytest.mark.parametrize(
    "samples, expected",
    [
        ([_sample("math", 1.0), _sample("math", 0.0)], {}),  # single-turn, no calls: not agentic
        (
            [
                _sample("tool_use", 1.0, turns=2, calls=1),
                _sample("tool_use", 0.5, turns=3, calls=1, malformed=2, errors=1),
                _sample("math", 1.0),
            ],
            {
                "agent/tool_use/success_rate": 0.5,
                "agent/tool_use/well_formed_call_rate": 0.5,
                "agent/tool_use/turns_mean": 2.5,
                "agent/tool_use/tool_calls_mean": 1.0,
                "agent/tool_use/tool_errors_mean": 0.5,
            },
        ),
        (
            [_sample("tool_use", 0.0, turns=2)],  # talked twice without calling: rate undefined, not 0
            {
                "agent/tool_use/success_rate": 0.0,
                "agent/tool_use/well_formed_call_rate": math.nan,
                "agent/tool_use/turns_mean": 2.0,
                "agent/tool_use/tool_calls_mean": 0.0,
                "agent/tool_use/tool_errors_mean": 0.0,
            },
        ),
    ],
)
def test_agentic_metrics(samples, expected):
    row = agentic_metrics(samples, success_threshold=0.9)
    assert row.keys() == expected.keys()
    assert row == pytest.approx(expected, nan_ok=True)


def _metrics(path: Path, keys: dict[str, float], iterations: int = 3) -> Path:
    rows = [{"iteration": 0, "eval/math/accuracy": 0.1}]
    rows += [
        {"iteration": i, "reward/mean": 0.1 * i, **{k: v * i for k, v in keys.items()}}
        for i in range(1, iterations + 1)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


DIAGNOSTIC_KEYS = {
    "rollout/groups_nonzero_adv_frac": 0.2,
    "rollout/groups_nonzero_adv_frac/math": 0.3,
    "rollout/reward_std_mean": 0.1,
    "rollout/reward_std_max": 0.4,
    "train/entropy": 1.5,
    "train/logratio_abs_mean": 0.01,
    "train/logratio_abs_max": 0.2,
    "train/grad_norm": 3.0,
    "train/muon_update_rms": 2e-4,
}


@pytest.mark.parametrize(
    "keys, written",
    [
        ({}, {"reward.png", "heldout_accuracy.png"}),  # an old run: no diagnostics.png, no length plot
        (
            {"rollout/truncation_rate": 0.1, "rollout/response_tokens_mean": 50.0},
            {"reward.png", "heldout_accuracy.png", "length_truncation.png"},
        ),
        ({"train/grad_norm": 3.0}, {"reward.png", "heldout_accuracy.png", "diagnostics.png"}),  # one panel is enough
        (DIAGNOSTIC_KEYS, {"reward.png", "heldout_accuracy.png", "diagnostics.png"}),
        (
            {**DIAGNOSTIC_KEYS, "rollout/truncation_rate": 0.1},  # a panel of a figure may be missing
            {"reward.png", "heldout_accuracy.png", "diagnostics.png", "length_truncation.png"},
        ),
        (
            {"agent/tool_use/success_rate": 0.3, "agent/tool_use/turns_mean": 2.0},
            {"reward.png", "heldout_accuracy.png", "agentic.png"},
        ),
    ],
)
def test_write_plots_diagnostics(tmp_path, keys, written):
    out = tmp_path / "plots"
    paths = write_plots(_metrics(tmp_path / "metrics.jsonl", keys), out)
    assert {p.name for p in paths} == written
    assert {p.name for p in out.glob("*.png")} == written
    assert all(p.stat().st_size > 1000 and p.read_bytes()[:4] == b"\x89PNG" for p in paths)


def test_diagnostics_figure_grows_with_its_panels(tmp_path):
    from PIL import Image

    sizes = []
    for name, keys in (("one", {"train/entropy": 1.0}), ("all", DIAGNOSTIC_KEYS)):
        (tmp_path / name).mkdir()
        write_plots(_metrics(tmp_path / name / "metrics.jsonl", keys), tmp_path / name / "plots")
        sizes.append(Image.open(tmp_path / name / "plots" / "diagnostics.png").size)
    assert sizes[0][1] < sizes[1][1]  # 1 panel: one row; 6 panels: a 3 x 2 grid


def test_train_rows_carry_the_signal_of_the_trained_groups():
    import types

    from k2post.rl import batch as rb
    from k2post.rl.config import ISCorrectionConfig, BudgetConfig, LengthPenaltyConfig
    from k2post.rl.controller import PhaseTimer, RLRun
    from rl_fakes import FakeRolloutGroup, FakeTrainerGroup

    run = RLRun.__new__(RLRun)
    run.ledger, run.perf = {}, None  # no FLOPs model: tokens/s without MFU
    calls: list = []
    run.trainers, run.rollouts = FakeTrainerGroup(1, calls), FakeRolloutGroup(1, 0, calls, False, {})
    run.state = types.SimpleNamespace(book=rb.GroupBook(k=2), step=0)
    run.cfg = types.SimpleNamespace(
        loss=types.SimpleNamespace(
            max_steps_per_iteration=2,
            groups_per_step=2,
            micro_batch_size=2,
            drop_uniform_groups=False,
            is_correction=ISCorrectionConfig(),
        ),
        budget=BudgetConfig(),
        length_penalty=LengthPenaltyConfig(),
        reward=types.SimpleNamespace(success_threshold=0.5),
        trainer=types.SimpleNamespace(world_size=1, offload_during_rollout=False),
    )
    rewards = {
        "a": (1.0, 0.0),
        "b": (1.0, 1.0),
        "c": (0.0, 0.0),
        "d": (0.0, 0.0),
        "e": (1.0, 0.0),
    }  # e waits for the next iteration
    for group_id, (r0, r1) in rewards.items():
        run.state.book.open(group_id)
        env = "code" if group_id == "a" else "math"
        run.state.book.add(
            [
                rb.Sample(group_id, i, env, "t", group_id, [1, 2], [0, 1], r, False, "stop")
                for i, r in enumerate((r0, r1))
            ]
        )
    rows = run.train(0, PhaseTimer())
    assert len(rows) == 2 and len(run.state.book.ready) == 1
    assert sorted(run.ledger["trained"]) == ["a", "b", "c", "d"]  # the ledger's ids of the groups trained
    for row in rows:  # identical in every step's row, so the controller's step average keeps them
        assert row["rollout/groups_nonzero_adv_frac"] == pytest.approx(0.25)
        assert row["rollout/groups_nonzero_adv_frac/code"] == 1.0 and row["rollout/groups_nonzero_adv_frac/math"] == 0.0
        assert row["rollout/reward_std_mean"] == pytest.approx(0.125) and row[
            "rollout/reward_std_max"
        ] == pytest.approx(0.5)


def test_long_episode_metrics_report_context_elisions_and_checkpoints():
    long = [_sample("record_audit", 0.9, turns=200, calls=200), _sample("record_audit", 0.3, turns=120, calls=120)]
    long[0].context = {"windows": 31, "elisions": 30, "context_peak": 940, "stored_tokens": 28000}
    long[1].context = {"windows": 11, "elisions": 10, "context_peak": 900, "stored_tokens": 9000}
    long[0].checkpoint_pass_rate, long[1].checkpoint_pass_rate = 1.0, 0.5
    row = agentic_metrics(long, success_threshold=0.9)
    assert row["agent/record_audit/tool_calls_mean"] == 160
    assert row["agent/record_audit/elisions_mean"] == 20 and row["agent/record_audit/context_peak_mean"] == 920
    assert row["agent/record_audit/checkpoint_pass_rate"] == 0.75
