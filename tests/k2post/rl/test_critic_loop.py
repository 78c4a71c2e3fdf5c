"""The critic in the RL loop (pure parts): pending groups, metric merging, the calibration harvester, growing pools."""

from __future__ import annotations

import pickle
from dataclasses import dataclass

import pytest

from k2post.chat.types import Message
from k2post.envs.base import Task
from k2post.envs.registry import make_environment
from k2post.rl.config import PromptSamplingConfig
from k2post.rl.critic_loop import CalibrationHarvester, PendingGroups, final_text, group_of, merge_metrics
from k2post.rl.sampling import PromptSampler


@dataclass
class _Episode:
    id: str
    messages: list


def _ep(group: str, k: int, text: str = "x") -> _Episode:
    return _Episode(f"{group}/{k}", [Message(role="user", content="q"), Message(role="assistant", content=text)])


def test_pending_groups_release_complete_groups_in_index_order_and_pickle():
    pending = PendingGroups(k=3)
    assert pending.add([_ep("g1", 2), _ep("g2", 0)]) == {}
    done = pending.add([_ep("g1", 0), _ep("g1", 1)])
    assert list(done) == ["g1"] and [e.id for e in done["g1"]] == ["g1/0", "g1/1", "g1/2"]
    restored = pickle.loads(pickle.dumps(pending))
    assert list(restored.episodes) == ["g2"]
    restored.drop(["g2"])
    assert restored.add([_ep("g2", 1), _ep("g2", 2)]) == {}  # g2/0 was dropped with its actor


def test_group_of_and_final_text():
    assert group_of("i3-math-1/7") == ("i3-math-1", 7)
    assert final_text(_ep("g", 0, "hello")) == "hello"
    assert final_text(_Episode("g/0", [Message(role="user", content="q")])) == ""


@pytest.mark.parametrize(
    "parts,expected",
    [
        (
            [{"critic/calls": 4, "critic/tie_rate": 0.5}, {"critic/calls": 6, "critic/tie_rate": 0.0}],
            {"critic/calls": 10, "critic/tie_rate": 0.25},
        ),
        ([{"critic/tokens": 10.0}], {"critic/tokens": 10.0}),
        ([], {}),
        ([{"critic/score_mean": 0.2}, {"critic/calls": 2}], {"critic/score_mean": 0.2, "critic/calls": 2}),
    ],
)
def test_merge_metrics_sums_counts_and_averages_rates(parts, expected):
    assert merge_metrics(parts) == pytest.approx(expected)


def test_harvester_makes_verified_judge_tasks_only_from_sources_and_stops_at_its_cap():
    calibration = make_environment("critic_calibration", {"sources": [{"name": "math", "config": {"difficulty": 1}}]})
    harvester = CalibrationHarvester("critic_calibration", calibration, 0.5, pairs_per_group=2, max_tasks=3, seed=0)
    task = Task(
        id="math-train-1",
        env="math",
        task_type="math",
        messages=[Message(role="user", content="What is 2 + 2?")],
        answer="4",
    )
    tasks = harvester.harvest(
        "math", task, ["\\boxed{4}", "\\boxed{5}", "\\boxed{6}", "\\boxed{4}"], [1.0, 0.0, 0.0, 1.0]
    )
    assert len(tasks) == 2 and all(t.env == "critic_calibration" and t.answer in ("A", "B") for t in tasks)
    assert all(calibration.score(t, f"[[{t.answer}]]").value == 1.0 for t in tasks)
    assert harvester.harvest("reasoning_gym", task, ["a", "b"], [1.0, 0.0]) == []  # not a source
    assert harvester.harvest("math", task, ["4", "4"], [1.0, 1.0]) == []  # nothing to tell apart
    assert (
        len(harvester.harvest("math", task, ["\\boxed{4}", "\\boxed{7}", "\\boxed{8}"], [1.0, 0.0, 0.0])) == 1
    )  # cap 3
    assert harvester.harvest("math", task, ["\\boxed{4}", "\\boxed{9}"], [1.0, 0.0]) == []


def test_sampler_grows_and_round_trips_its_pool():
    sampler = PromptSampler(["a", "b"], PromptSamplingConfig(strategy="uniform"), seed=0)
    assert sampler.add(["b", "c", "c", "d"]) == 2 and sampler.ids == ["a", "b", "c", "d"]
    sampler.update({"d": 1.0})
    fresh = PromptSampler(["a", "b"], PromptSamplingConfig(strategy="uniform"), seed=0)
    fresh.load_state_dict(sampler.state_dict())
    assert fresh.ids == sampler.ids and fresh.sample(4, 0) == sampler.sample(4, 0)


def test_harvester_adds_a_pair_drawn_twice_once_and_resumes_its_count():
    calibration = make_environment("critic_calibration", {"sources": [{"name": "math", "config": {"difficulty": 1}}]})
    harvester = CalibrationHarvester("critic_calibration", calibration, 0.5, pairs_per_group=2, max_tasks=10, seed=0)
    task = Task(
        id="math-train-1",
        env="math",
        task_type="math",
        messages=[Message(role="user", content="What is 2 + 2?")],
        answer="4",
    )
    group = (["\\boxed{4}", "\\boxed{5}"], [1.0, 0.0])
    first = harvester.harvest("math", task, *group)
    assert len(first) == 1 and harvester.harvest("math", task, *group) == [] and harvester.added == 1
    resumed = CalibrationHarvester("critic_calibration", calibration, 0.5, pairs_per_group=2, max_tasks=10, seed=0)
    resumed.restore(first)
    assert resumed.added == 1 and resumed.harvest("math", task, *group) == []
