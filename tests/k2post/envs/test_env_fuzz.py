"""Fuzz every registered environment: hostile responses never raise and stay in reward_range.

Direct path: `env.score` (and reset/step/score_state for multi-turn envs) must not raise on
anything; built-ins are required to be robust. Pool path: the same responses through a
RewardPool come back without errors (a timeout is reported, not hidden). Case counts are
printed in the terminal summary ("environment fuzzing"). K2POST_FUZZ_EXAMPLES=N runs more;
K2POST_FUZZ_RANDOM=1 draws new examples each run (default: derandomized, CI-stable).
"""

from __future__ import annotations

import os
from importlib.metadata import entry_points

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from k2post_toy_envs import FAULTY_ENVS

from k2post.envs import ENTRY_POINT_GROUP, make_environment, registered_environments
from k2post.envs.fuzz import (
    CASES_RUN,
    NON_STRING_RESPONSES,
    bomb_cases,
    check_reward,
    edge_cases,
    episode_checked,
    responses,
    score_checked,
    tool_messages,
)
from k2post.envs.workers import RewardPool


def _fuzz_targets() -> list[str]:
    """Built-ins, entry-point envs and this suite's robust toy envs (not envs that other test
    modules may have registered, possibly broken on purpose)."""
    entry_names = {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
    ours = ("k2post_environments.", "k2post_toy_envs")
    return sorted(
        name
        for name, cls in registered_environments().items()
        if name not in FAULTY_ENVS and (cls.__module__.startswith(ours) or name in entry_names)
    )


ENVS = _fuzz_targets()
DEFAULT_EXAMPLES = int(os.environ.get("K2POST_FUZZ_EXAMPLES", "40"))
RANDOM = os.environ.get("K2POST_FUZZ_RANDOM") == "1"  # default: the same examples every run (CI-stable)
FEW_EXAMPLES = {"code": 6}  # every score runs a sandbox subprocess
POOL_SAMPLE = 12  # generated responses also sent through the pool, per env
TASKS_PER_ENV = 3


def _settings(name: str):
    return settings(
        max_examples=FEW_EXAMPLES.get(name, DEFAULT_EXAMPLES),
        deadline=None,
        derandomize=not RANDOM,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


@pytest.fixture(scope="module")
def pool():
    with RewardPool(num_workers=2, timeout_s=30.0) as reward_pool:
        yield reward_pool


def _fixed_responses(name: str, task) -> list[str]:
    gold = [f"\\boxed{{{task.answer}}}", str(task.answer)] if task.answer is not None else []
    cases = gold + edge_cases()
    if name in FEW_EXAMPLES:  # a sandbox run each: the first few, and the bombs aimed at this env's extraction
        return cases[:3] + [case for case in bomb_cases() if case.startswith("```")]
    return cases


@pytest.mark.parametrize("name", ENVS)
def test_fuzz_environment(name, pool):
    env = make_environment(name)
    tasks = list(env.tasks("train", seed=0, n=TASKS_PER_ENV))
    assert tasks, f"{name}: tasks('train', seed=0) yielded nothing"
    counts = CASES_RUN.setdefault(name, {"direct": 0, "pool": 0})
    sample = _run_direct(name, env, tasks, counts)
    fixed = _fixed_responses(name, tasks[0])
    for response in fixed + NON_STRING_RESPONSES:
        score_checked(env, tasks[0], response)
    counts["direct"] += len(fixed) + len(NON_STRING_RESPONSES)
    if env.multi_turn:
        counts["episodes"] = _fuzz_episodes(name, env, tasks)
    items = [(name, {}, tasks[0], response) for response in fixed + sample]
    rewards = pool.score_batch(items)
    counts["pool"] = len(rewards)
    for reward in rewards:
        check_reward(env, reward)
    errors = [r.error for r in rewards if r.error is not None]
    assert not errors, f"{name}: pool scoring errors: {errors[:3]}"


def _run_direct(name: str, env, tasks, counts: dict[str, int]) -> list[str]:
    sample: list[str] = []

    @_settings(name)
    @given(task=st.sampled_from(tasks), response=responses())
    def run(task, response):
        counts["direct"] += 1
        if len(sample) < POOL_SAMPLE:
            sample.append(response)
        score_checked(env, task, response)

    run()
    return sample


def _fuzz_episodes(name: str, env, tasks) -> int:
    names = [tool.name for tool in env.tools()]
    ran = 0

    @_settings(name)
    @given(task=st.sampled_from(tasks), turns=st.lists(tool_messages(names), min_size=1, max_size=4))
    def run(task, turns):
        nonlocal ran
        ran += 1
        episode_checked(env, task, turns)

    run()
    return ran


def test_fuzz_checks_raise_fuzz_failure_not_name_error():
    from k2post.envs.base import Reward
    from k2post.envs.fuzz import FuzzFailure, check_reward
    from k2post.envs.registry import make_environment

    env = make_environment("math")
    with pytest.raises(FuzzFailure, match="outside reward_range"):
        check_reward(env, Reward(value=5.0))
    with pytest.raises(FuzzFailure, match="expected Reward"):
        check_reward(env, 1.0)
