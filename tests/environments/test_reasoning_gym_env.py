"""Reasoning-gym adapter: tasks per dataset, disjoint splits, re-scoring from JSON, junk answers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from k2post_environments.reasoning_gym_env import ReasoningGymEnv, _dataset, clip_score
from k2post.envs import Task, make_environment

GOLDEN = Path(__file__).resolve().parents[2] / "environments" / "golden" / "reasoning_gym.jsonl"
DEMO_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "rl_demo.yaml"
SHORT_ANSWER_SETS = [
    "basic_arithmetic",
    "chain_sum",
    "products",
    "letter_counting",
    "gcd",
    "lcm",
    "count_bits",
    "spell_backward",
    "simple_equations",
    "leg_counting",
]


def _env(dataset: str = "basic_arithmetic", **extra) -> ReasoningGymEnv:
    return make_environment("reasoning_gym", {"dataset": dataset, "size": 30, "test_size": 10, "dev_size": 10, **extra})


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


# ---------------------------------------------------------------- splits: train / dev / test / shifted

DEMO = next(e["config"] for e in yaml.safe_load(DEMO_CONFIG.read_text())["envs"] if e["name"] == "reasoning_gym")


def _questions(env: ReasoningGymEnv, split: str, **kwargs) -> list[str]:
    return [t.metadata["entry"]["question"] for t in env.tasks(split, **kwargs)]


def _terms(question: str) -> int:
    return len(re.findall(r"\d+", question.rsplit(":", 1)[1]))


@pytest.fixture(scope="module")
def demo() -> ReasoningGymEnv:
    return make_environment("reasoning_gym", DEMO)


@pytest.mark.parametrize("split", ["dev", "test", "shifted"])
def test_demo_held_out_splits_are_large_distinct_and_fixed(demo, split):
    questions = _questions(demo, split)
    assert len(set(questions)) == len(questions) >= 200
    assert questions == _questions(make_environment("reasoning_gym", DEMO), split, seed=9)


@pytest.mark.parametrize("first,second", [("test", "dev"), ("test", "shifted"), ("dev", "shifted")])
def test_demo_held_out_splits_are_disjoint(demo, first, second):
    assert not set(_questions(demo, first)) & set(_questions(demo, second))


@pytest.mark.parametrize("split", ["dev", "test", "shifted"])
def test_demo_train_never_yields_a_held_out_question(demo, split):
    train = {q for seed in range(3) for q in _questions(demo, "train", seed=seed, n=1000)}
    assert len(train) > 500 and not train & set(_questions(demo, split))


def test_demo_shifted_has_one_term_more_than_train(demo):
    assert demo.shifted_config() == {**DEMO["dataset_config"], "min_terms": 4, "max_terms": 4}
    assert {_terms(q) for q in _questions(demo, "shifted")} == {4}
    assert {_terms(q) for q in _questions(demo, "train", n=300)} == {2, 3}
    task = next(demo.tasks("shifted"))
    assert task.id.startswith("rg-chain_sum-shifted-") and task.metadata["dataset_config"]["max_terms"] == 4
    fresh = Task.model_validate_json(task.model_dump_json())
    assert demo.score(fresh, f"\\boxed{{{task.answer}}}").value == 1.0


def test_explicit_shifted_config_overrides_the_dataset_config():
    env = _env(
        "chain_sum",
        dataset_config={"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1},
        shifted_config={"min_digits": 2, "max_digits": 2},
        shifted_size=20,
    )
    numbers = [int(x) for q in _questions(env, "shifted") for x in re.findall(r"\d+", q.rsplit(":", 1)[1])]
    assert len(_questions(env, "shifted")) == 20 and min(numbers) >= 10


def test_a_space_the_held_out_sets_exhaust_is_a_clear_error():
    tiny = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}  # ~200 distinct questions in all
    with pytest.raises(ValueError, match="reasoning_gym: every train question .* widen dataset_config"):
        list(make_environment("reasoning_gym", {"dataset": "chain_sum", "dataset_config": tiny}).tasks("train"))


@pytest.mark.parametrize(
    "config,split,needle",
    [
        ({"dataset": "dice"}, "shifted", "reasoning_gym: dataset 'dice' has no min_\\*/max_\\* integer range"),
        ({}, "holdout", "reasoning_gym: unknown split 'holdout'"),
    ],
)
def test_unsupported_splits_are_one_line_errors(config, split, needle):
    with pytest.raises(ValueError, match=needle) as err:
        list(make_environment("reasoning_gym", config).tasks(split))
    assert "\n" not in str(err.value)


# --- issue 43: one final answer is scored; hedges earn nothing -----------------------------------------------------

from cheap_strategies import assert_unhackable, means, strategy_table  # noqa: E402

from k2post_environments.reasoning_gym_env import candidates, near_miss  # noqa: E402

CHAIN = {"dataset": "chain_sum", "dataset_config": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1}}


@pytest.mark.parametrize(
    "template,value,hedge",
    [
        ("\\boxed{{{lo} {g} {hi}}}", 0.0, True),  # reasoning-gym's substring credit would pay len(g) / len(answer)
        ("{lo} {g} {hi}", 0.0, True),
        ("{lo}, {g}, {hi}", 0.0, True),
        ("\\boxed{{{g} or {hi}}}", 0.0, True),
        ("\\boxed{{{lo}}} \\boxed{{{g}}}", 0.0, True),  # two different final answers: the last is not taken
        ("\\boxed{{{g}}} \\boxed{{{hi}}}", 0.0, True),
        ("first \\boxed{{{g}}}, checked: \\boxed{{{g}}}", 1.0, False),  # the same answer twice is one answer
        ("\\boxed{{{g}}}", 1.0, False),
        ("\\boxed{{{hi}}}", 0.0, False),
    ],
)
def test_hedges_get_no_partial_credit(template, value, hedge):
    env = make_environment("reasoning_gym", {**CHAIN, "test_size": 4, "dev_size": 4})  # reasoning-gym's default scorer
    for task in env.tasks("test"):
        gold = str(task.answer)
        response = template.format(g=gold, lo=near_miss(gold, -1), hi=near_miss(gold))
        reward = env.score(task, response)
        assert reward.value == pytest.approx(value), response
        assert reward.info.get("hedged", False) == hedge, response


@pytest.mark.parametrize("text,count", [("-4", 1), ("-5 -4 -3", 3), ("a, b; c | d / e", 5), ("4 or 5 and 6", 3)])
def test_candidates(text, count):
    assert candidates(text) == count


@pytest.mark.parametrize(
    "gold,step,wrong", [("-4", 1, "-3"), ("12", -1, "11"), ("nibac", 1, "nibca"), ("aa", 1, "aax")]
)
def test_near_miss(gold, step, wrong):
    assert near_miss(gold, step) == wrong


@pytest.mark.parametrize("config", [CHAIN, {"dataset": "basic_arithmetic"}, {"dataset": "spell_backward"}])
def test_no_cheap_strategy_pays_more_than_an_honest_wrong_answer(config):
    env = make_environment("reasoning_gym", {**config, "test_size": 12, "dev_size": 4})
    table = strategy_table(env, list(env.tasks("test", n=12)))
    assert_unhackable(table)
    assert means(table)["neighbours_one_box"] == 0.0 and means(table)["hedge_wrong_right"] == 0.0
