"""Budget control, K1.5 length reward, temperature decay and prompt sampling: parametrized tables."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from k2post.rl.config import (
    BudgetConfig,
    LengthPenaltyConfig,
    PromptSamplingConfig,
    TemperatureConfig,
    TemperatureScheduleConfig,
)
from k2post.rl.sampling import PromptSampler, curriculum_open, priority_weights, weighted_without_replacement
from k2post.rl.schedules import temperature_at, temperature_for
from k2post.rl.shaping import apply_budget, grouped_length_rewards, length_rewards


@pytest.mark.parametrize(
    ("penalty", "value", "expected"),
    [
        ("replace", 0.0, [1.0, 0.0, 0.0]),
        ("replace", -1.0, [1.0, -1.0, -1.0]),
        ("subtract", 0.5, [1.0, 0.5, -0.5]),
        ("none", 9.0, [1.0, 1.0, 0.0]),
    ],
)
def test_budget_penalty(penalty, value, expected):
    cfg = BudgetConfig(penalty=penalty, penalty_value=value)
    assert apply_budget([1.0, 1.0, 0.0], [False, True, True], cfg) == expected


def test_budget_per_task_type_and_errors():
    cfg = BudgetConfig(default_max_tokens=100, max_tokens={"math": 32})
    assert (cfg.budget_for("math"), cfg.budget_for("tool_use")) == (32, 100)
    with pytest.raises(ValueError, match="max_tokens must be positive"):
        BudgetConfig(max_tokens={"math": 0})
    with pytest.raises(ValueError, match="2 rewards but 1"):
        apply_budget([1.0, 0.0], [True], cfg)


def test_reasoning_budget_per_task_type():
    cfg = BudgetConfig(default_reasoning_max_tokens=64, reasoning_max_tokens={"math": 16})
    assert (cfg.reasoning_budget_for("math"), cfg.reasoning_budget_for("tool_use")) == (16, 64)
    assert BudgetConfig().reasoning_budget_for("math") is None  # no own budget unless configured
    with pytest.raises(ValueError, match="reasoning_max_tokens must be positive"):
        BudgetConfig(reasoning_max_tokens={"math": -1})


@pytest.mark.parametrize(
    ("lengths", "correct", "expected"),
    [
        ([10, 20, 30], [True, True, True], [0.5, 0.0, -0.5]),
        ([10, 20, 30], [False, False, False], [0.0, 0.0, -0.5]),
        ([10, 30], [False, True], [0.0, -0.5]),
        ([7, 7, 7], [True, False, True], [0.0, 0.0, 0.0]),
    ],
)
def test_k15_length_reward(lengths, correct, expected):
    assert length_rewards(lengths, correct) == pytest.approx(expected)


def test_length_reward_groups_weight_and_warmup():
    cfg = LengthPenaltyConfig(enabled=True, weight=2.0, warmup_iterations=3)
    lengths, correct = [10, 30, 5, 5], [True, True, True, False]
    assert grouped_length_rewards(lengths, correct, 2, cfg, iteration=2) == [0.0] * 4
    assert grouped_length_rewards(lengths, correct, 2, cfg, iteration=3) == pytest.approx([1.0, -1.0, 0.0, 0.0])
    assert grouped_length_rewards(lengths, correct, 2, LengthPenaltyConfig(), iteration=9) == [0.0] * 4


@pytest.mark.parametrize(
    ("kind", "iteration", "expected"),
    [
        ("constant", 50, 1.0),
        ("linear", 0, 1.0),
        ("linear", 50, 0.75),
        ("linear", 100, 0.5),
        ("linear", 500, 0.5),
        ("cosine", 50, 0.75),
        ("cosine", 25, 1.0 - 0.5 * 0.5 * (1 - math.cos(math.pi / 4))),
        ("exponential", 50, 0.5**0.5),
        ("exponential", 100, 0.5),
    ],
)
def test_temperature_schedules(kind, iteration, expected):
    cfg = TemperatureScheduleConfig(kind=kind, start=1.0, end=0.5, decay_iterations=100)
    assert temperature_at(cfg, iteration) == pytest.approx(expected)


def test_temperature_per_task_type():
    cfg = TemperatureConfig(
        per_task_type={"math": TemperatureScheduleConfig(kind="linear", start=1.2, end=0.6, decay_iterations=10)}
    )
    assert temperature_for(cfg, "math", 5) == pytest.approx(0.9)
    assert temperature_for(cfg, "tool_use", 0) == pytest.approx(1.0)


def test_priority_weights_and_weighted_draw():
    cfg = PromptSamplingConfig(min_weight=0.05, prior_success=0.5)
    assert priority_weights([None, 0.0, 1.0, 0.75], cfg) == pytest.approx([0.5, 1.0, 0.05, 0.25])
    rng, counts = random.Random(0), Counter()
    for _ in range(4000):
        counts.update(weighted_without_replacement(rng, ["hard", "easy"], [0.9, 0.1], 1))
    assert 0.85 < counts["hard"] / 4000 < 0.95
    with pytest.raises(ValueError, match="pool of 2"):
        weighted_without_replacement(rng, ["a", "b"], [1, 1], 3)


def test_prioritized_sampler_prefers_failed_tasks_and_resumes():
    ids = [f"t{i}" for i in range(20)]
    sampler = PromptSampler(ids, PromptSamplingConfig(strategy="prioritized"), seed=1)
    sampler.update({t: (1.0 if i < 10 else 0.0) for i, t in enumerate(ids)})  # t0-t9 solved
    state = sampler.state_dict()
    draws = Counter(t for _ in range(300) for t in sampler.sample(5, 0))
    solved = sum(draws[f"t{i}"] for i in range(10))
    assert solved < 0.1 * sum(draws.values())
    batch = sampler.sample(8, 0)
    assert len(set(batch)) == 8
    twin = PromptSampler(ids, PromptSamplingConfig(strategy="prioritized"), seed=99)
    twin.load_state_dict(state)
    sampler.load_state_dict(state)
    assert twin.sample(6, 3) == sampler.sample(6, 3)  # bit-for-bit after resume
    with pytest.raises(KeyError, match="not in the pool"):
        sampler.update({"zz": 1.0})


def test_curriculum_opens_easy_first():
    cfg = PromptSamplingConfig(strategy="curriculum", curriculum_start=0.25, curriculum_iterations=10)
    difficulty = {f"t{i}": float(i) for i in range(8)}
    sampler = PromptSampler(list(reversed(difficulty)), cfg, difficulty=difficulty, seed=0)
    assert (curriculum_open(8, cfg, 0), curriculum_open(8, cfg, 5), curriculum_open(8, cfg, 20)) == (2, 5, 8)
    assert set(sampler.sample(8, 0)) == {"t0", "t1"}
    assert set(sampler.sample(8, 10)) == set(difficulty)
    with pytest.raises(ValueError, match="curriculum needs a difficulty"):
        PromptSampler(["a"], cfg)


@pytest.mark.parametrize(
    "schedule,step,expected",
    [
        ("constant", 0, 1.0),
        ("constant", 39, 1.0),
        ("cosine", 0, 1.0),
        ("cosine", 20, 0.55),
        ("cosine", 40, 0.1),
    ],
)
def test_rl_lr_schedule_over_the_runs_optimizer_steps(schedule, step, expected):
    """The trainer's lr factor: the SFT schedule over iterations x max_steps_per_iteration (clamped at the end)."""
    from k2post.rl.run_config import RLConfig
    from k2post.train.schedule import lr_factor

    cfg = RLConfig(
        envs=[{"name": "math"}],
        rollout={"agentic": {"max_episode_tokens": 256}},
        loss={"max_steps_per_iteration": 2},
        train={"iterations": 20},
        schedule={"kind": schedule, "min_lr_ratio": 0.1},
    )
    total = cfg.total_optimizer_steps()
    assert total == 40
    assert lr_factor(min(step, total - 1), total, cfg.schedule) == pytest.approx(
        expected, abs=0.01 if step == 40 else 1e-9
    )
