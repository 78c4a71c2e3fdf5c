"""The self-critique critic inside the RL loop: group-scored environments and the calibration closed loop.

    pending = PendingGroups(k=8)
    complete = pending.add(finished_episodes_of_group_scored_envs)      # group id -> its K episodes
    group_ids, calls = judge_calls(complete, replica_of)               # one call per (replica, env)
    rewards, metrics = judged_rewards(group_ids, rollouts.score_groups(calls)[0])  # judged where the policy runs
    new_tasks = harvester.harvest(group_samples, source_task)           # verifier-labelled pairs -> judge tasks

- A group-scored environment (`GroupScoredEnvironment`, e.g. `self_critique`) rewards the K responses
  to a prompt together, so its finished episodes wait in `PendingGroups` until the group is complete,
  then the rollout actor that ran them scores the group with its own engine as the judge
  (`RolloutWorker.score_groups`, through `RolloutGroup.score_groups`). Metrics of all calls are merged
  (`critic/*`).
- `CalibrationHarvester` turns every completed group of a `critic_calibration` source environment with
  mixed rewards into (correct, wrong) pairs and those into judge tasks for the calibration
  environment's train pool: on-policy pairs, labelled by the verifier (the closed loop).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from k2post.envs.base import Environment, Reward, Task
from k2post.evaluation.heldout import final_text

SUMMED = ("critic/calls", "critic/prompt_tokens", "critic/completion_tokens", "critic/tokens")


def group_of(episode_id: str) -> tuple[str, int]:
    """(group id, index in the group) of an RL episode id `<group>/<k>`."""
    group_id, index = episode_id.rsplit("/", 1)
    return group_id, int(index)


def merge_metrics(parts: Sequence[dict[str, float]]) -> dict[str, float]:
    """Counts (calls, tokens) summed, rates and means averaged over the parts."""
    keys = sorted({key for part in parts for key in part})
    merged = {}
    for key in keys:
        values = [part[key] for part in parts if key in part]
        merged[key] = sum(values) if key in SUMMED else sum(values) / len(values)
    return merged


class PendingGroups:
    """Finished episodes of group-scored environments, held until their group of K is complete (pickled
    with the controller state, so a resumed run keeps them)."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.episodes: dict[str, dict[int, Any]] = {}

    def add(self, episodes: Sequence[Any]) -> dict[str, list[Any]]:
        """File episodes; return (and forget) the groups that are now complete, episodes in index order."""
        for episode in episodes:
            group_id, index = group_of(episode.id)
            self.episodes.setdefault(group_id, {})[index] = episode
        complete = {g: [eps[i] for i in range(self.k)] for g, eps in self.episodes.items() if len(eps) == self.k}
        for group_id in complete:
            del self.episodes[group_id]
        return complete

    def drop(self, group_ids: Sequence[str]) -> None:
        """Forget groups lost with a dead rollout actor."""
        for group_id in group_ids:
            self.episodes.pop(group_id, None)


JudgeKey = tuple[int, str]  # (replica, env_name): one judging call


def judge_calls(
    complete: dict[str, list[Any]], replica_of: Callable[[str], int]
) -> tuple[dict[JudgeKey, list[str]], dict[JudgeKey, list[tuple[Task, list[str]]]]]:
    """Complete groups -> one judging call per (replica that ran them, env): (group ids per call, the call's
    (task, final texts) items in the same order)."""
    group_ids: dict[JudgeKey, list[str]] = {}
    for group_id, episodes in complete.items():
        group_ids.setdefault((replica_of(group_id), episodes[0].env_name), []).append(group_id)
    items = {
        key: [(complete[g][0].task, [final_text(e) for e in complete[g]]) for g in groups]
        for key, groups in group_ids.items()
    }
    return group_ids, items


def judged_rewards(
    group_ids: dict[JudgeKey, list[str]], results: dict[JudgeKey, tuple[list[list[Reward]], dict[str, float]]]
) -> tuple[dict[str, list[Reward]], dict[str, float]]:
    """The calls' results (calls lost with a dead replica are missing) -> (rewards by group id, merged metrics)."""
    rewards: dict[str, list[Reward]] = {}
    for key, (group_rewards, _) in results.items():
        rewards.update(zip(group_ids[key], group_rewards))
    return rewards, merge_metrics([metrics for _, metrics in results.values()])


class CalibrationHarvester:
    """On-policy (correct, wrong) pairs from the calibration env's sources -> judge tasks for its train pool."""

    def __init__(
        self, env_name: str, env: Environment, threshold: float, pairs_per_group: int, max_tasks: int, seed: int
    ) -> None:
        self.env_name, self.env = env_name, env
        self.sources = {entry.name for entry in env.config.sources}
        self.threshold, self.pairs_per_group, self.max_tasks, self.seed = threshold, pairs_per_group, max_tasks, seed
        self.task_ids: set[str] = set()  # judge tasks already handed out: a pair drawn twice is added once

    @property
    def added(self) -> int:
        """Distinct judge tasks handed out so far (what `max_tasks` caps)."""
        return len(self.task_ids)

    def restore(self, tasks: Sequence[Task]) -> None:
        """Resume: the judge tasks an earlier part of the run added (from the controller state)."""
        self.task_ids = {task.id for task in tasks}

    def harvest(self, env_name: str, task: Task, texts: Sequence[str], rewards: Sequence[float]) -> list[Task]:
        """New judge tasks from one completed group of a source environment (none once `max_tasks` were added)."""
        from k2post.judging.calibration import pairs_from_group

        if env_name not in self.sources or self.added >= self.max_tasks:
            return []
        pairs = pairs_from_group(env_name, task, texts, rewards, self.threshold, self.pairs_per_group, self.seed)
        fresh = {task.id: task for task in (self.env.task_for(pair) for pair in pairs) if task.id not in self.task_ids}
        tasks = list(fresh.values())[: self.max_tasks - self.added]
        self.task_ids.update(task.id for task in tasks)
        return tasks
