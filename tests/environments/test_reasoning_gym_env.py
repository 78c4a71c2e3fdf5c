"""Reasoning-gym adapter: tasks per dataset, disjoint splits, re-scoring from JSON, junk answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from environments.reasoning_gym_env import ReasoningGymEnv, _dataset, clip_score
from k2post.envs import Task, make_environment

GOLDEN = Path(__file__).resolve().parents[2] / "environments" / "golden" / "reasoning_gym.jsonl"
SHORT_ANSWER_SETS = ["basic_arithmetic", "chain_sum", "products", "letter_counting", "gcd", "lcm",
                     "count_bits", "spell_backward", "simple_equations", "leg_counting"]


def _env(dataset: str = "basic_arithmetic", **extra) -> ReasoningGymEnv:
    return make_environment("reasoning_gym", {"dataset": dataset, "size": 30, "test_size": 10, **extra})


def test_registered():
    env = _env()
    assert (env.name, env.task_type, env.reward_range) == ("reasoning_gym", "reasoning", (0.0, 1.0))


def test_unknown_dataset_is_a_config_error():
    with pytest.raises(ValidationError, match="unknown reasoning-gym dataset"):
        make_environment("reasoning_gym", {"dataset": "no_such_set"})


@pytest.mark.parametrize("dataset", SHORT_ANSWER_SETS)
def test_gold_answer_scores_one_after_json_round_trip(dataset):
    env = _env(dataset)
    tasks = list(env.tasks("train", seed=0, n=3))
    assert tasks and all(t.env == "reasoning_gym" and t.task_type == "reasoning" for t in tasks)
    for task in tasks:
        task = Task.model_validate_json(task.model_dump_json())
        assert "\\boxed{}" in task.messages[0].content
        assert env.score(task, f"Let me think.\n\\boxed{{{task.answer}}}").value == 1.0
        assert env.score(task, f"work...\n{task.answer}").value == 1.0


def test_rescoring_rebuilds_a_non_json_entry_in_a_fresh_cache():
    env = _env("leg_counting")
    task = next(env.tasks("test"))
    assert task.metadata["entry_exact"] is False  # metadata tuples become lists in JSON
    _dataset.cache_clear()
    assert env.score(Task.model_validate_json(task.model_dump_json()), f"\\boxed{{{task.answer}}}").value == 1.0


def test_splits_disjoint_deterministic_and_seeded():
    env = _env()
    test_questions = [t.metadata["entry"]["question"] for t in env.tasks("test")]
    assert len(test_questions) == len(set(test_questions)) == 10
    train0 = [t.metadata["entry"]["question"] for t in env.tasks("train", seed=0)]
    train1 = [t.metadata["entry"]["question"] for t in env.tasks("train", seed=1)]
    assert train0 == [t.metadata["entry"]["question"] for t in _env().tasks("train", seed=0)]
    assert train0 != train1
    assert not set(test_questions) & (set(train0) | set(train1))
    ids = [t.id for t in env.tasks("train", seed=0)]
    assert len(ids) == len(set(ids))


def test_dataset_config_is_passed():
    env = _env("chain_sum", dataset_config={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1})
    task = next(env.tasks("train"))
    assert task.metadata["dataset_config"]["max_terms"] == 2
    assert env.score(task, f"\\boxed{{{task.answer}}}").value == 1.0


@pytest.mark.parametrize(
    "response, value",
    [
        ("", 0.0),
        ("\\boxed{}", 0.0),
        ("\\boxed{not a number}", 0.0),
        ("x" * 1_000_000, 0.0),
        ("\\boxed{" * 10_000, 0.0),
        ("<|tool_call_begin|>functions.x:0<|tool_call_end|>", 0.0),
        ("ünïcødé 🙂\n\x00", 0.0),
    ],
)
def test_junk_scores_zero(response, value):
    env = _env()
    reward = env.score(next(env.tasks("test")), response)
    assert reward.value == value and reward.error is None


def test_scorer_exception_becomes_zero_with_info():
    env = _env()
    task = next(env.tasks("test"))
    broken = task.model_copy(update={"metadata": {**task.metadata, "entry_exact": True, "entry": {"question": "q"}}})
    reward = env.score(broken, "\\boxed{3}")
    assert reward.value == 0.0 and "KeyError" in reward.info["error"]


@pytest.mark.parametrize(
    "raw, clipped", [(1.5, 1.0), (-2, 0.0), (0.25, 0.25), (float("nan"), 0.0), ("x", 0.0), (None, 0.0)]
)
def test_clip_score(raw, clipped):
    assert clip_score(raw) == clipped


def test_golden_file():
    cases = [json.loads(line) for line in GOLDEN.read_text().splitlines() if line.strip()]
    assert len(cases) >= 6
    env = make_environment("reasoning_gym", {})
    for case in cases:
        reward = env.score(Task.model_validate(case["task"]), case["response"])
        assert reward.value == pytest.approx(case["expected"], abs=case["tol"]), case["id"]
