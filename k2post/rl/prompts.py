"""The RL run's prompts: train pools and held-out tasks per environment, which prompts each iteration draws,
and what a completed group teaches the samplers (and the critic's calibration pool).

    prompts = PromptPools(cfg, envs)                    # envs: {name: Environment}
    groups = prompts.new_groups(iteration)              # [(group id, env name, task)]
    prompts.group_done(env_name, task_id, texts, rewards)  # sampler update; harvested judge tasks join the pool

Prompts per iteration are split over environments by weight (`allocate`); within an environment the
`PromptSampler` picks them (prioritized / curriculum, docs/RL.md). Pools can grow during the run
(critic_calibration harvests verifier-labelled pairs); the added tasks travel in the controller state.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

from k2post.envs.base import Environment, Task
from k2post.evaluation.heldout import draw_tasks
from k2post.rl.critic_loop import CalibrationHarvester
from k2post.rl.run_config import RLConfig
from k2post.rl.sampling import PromptSampler

CALIBRATION_ENV = "critic_calibration"


def allocate(counts_total: int, weights: dict[str, float], iteration: int, seed: int) -> dict[str, int]:
    """Split `counts_total` prompts over environments by weight (largest remainder, ties by a seeded order)."""
    total = sum(weights.values())
    exact = {name: counts_total * w / total for name, w in weights.items()}
    counts = {name: int(v) for name, v in exact.items()}
    order = sorted(exact, key=lambda n: (-(exact[n] - counts[n]), zlib.crc32(f"{seed}:{iteration}:{n}".encode())))
    for name in order[: counts_total - sum(counts.values())]:
        counts[name] += 1
    return counts


class PromptPools:
    """Train pools, held-out tasks and one prompt sampler per environment (plus the calibration harvester)."""

    def __init__(self, cfg: RLConfig, envs: dict[str, Environment]) -> None:
        self.cfg, self.envs = cfg, envs
        self.pools: dict[str, dict[str, Task]] = {}
        self.heldout: dict[str, list[Task]] = {}
        self.samplers: dict[str, PromptSampler] = {}
        self.added: dict[str, list[Task]] = {}  # tasks added during the run, per env (for the checkpoint)
        harvest = cfg.critic.harvest_pairs_per_group > 0
        for name, env in envs.items():
            self._build(name, env, may_start_empty=name == CALIBRATION_ENV and harvest)
        self.harvester = None
        if CALIBRATION_ENV in envs and harvest:
            self.harvester = CalibrationHarvester(
                CALIBRATION_ENV,
                envs[CALIBRATION_ENV],
                cfg.reward.success_threshold,
                cfg.critic.harvest_pairs_per_group,
                cfg.critic.max_harvested_tasks,
                cfg.seed,
            )

    def _build(self, name: str, env: Environment, may_start_empty: bool) -> None:
        train = self.cfg.train
        tasks = list(env.tasks("train", seed=self.cfg.seed, n=train.prompt_pool_per_env))
        if not tasks and not may_start_empty:  # critic_calibration may fill up online
            raise ValueError(f"environment {name!r} gave no train tasks")
        self.pools[name] = {task.id: task for task in tasks}
        self.heldout[name] = draw_tasks(env, train.eval_split, train.eval_tasks_per_env, self.cfg.seed)
        difficulty = {t.id: float(t.metadata.get("difficulty", 0)) for t in tasks}
        self.samplers[name] = PromptSampler(list(self.pools[name]), self.cfg.prompt_sampling, difficulty, self.cfg.seed)

    def new_groups(self, iteration: int) -> list[tuple[str, str, Task]]:
        """(group_id, env_name, task) of this iteration's prompts."""
        weights = {entry.name: entry.weight for entry in self.cfg.envs}
        counts = allocate(self.cfg.rollout.prompts_per_iteration, weights, iteration, self.cfg.seed)
        groups = []
        for name, count in counts.items():
            count = min(count, len(self.pools[name]))  # a pool that fills up during the run (critic_calibration)
            for j, task_id in enumerate(self.samplers[name].sample(count, iteration) if count else []):
                groups.append((f"i{iteration}-{name}-{j}", name, self.pools[name][task_id]))
        return groups

    def add_tasks(self, env_name: str, tasks: Sequence[Task]) -> int:
        """Grow an environment's train pool during the run; returns how many were new."""
        fresh = [t for t in tasks if t.id not in self.pools[env_name]]
        for task in fresh:
            self.pools[env_name][task.id] = task
        self.samplers[env_name].add([t.id for t in fresh])
        self.added.setdefault(env_name, []).extend(fresh)
        return len(fresh)

    def group_done(self, env_name: str, task_id: str, texts: Sequence[str], rewards: Sequence[float]) -> None:
        """A completed group: its success rate updates the env's sampler; calibration sources yield judge tasks."""
        threshold = self.cfg.reward.success_threshold
        self.samplers[env_name].update({task_id: sum(r >= threshold for r in rewards) / len(rewards)})
        if self.harvester is not None:
            new = self.harvester.harvest(env_name, self.pools[env_name][task_id], texts, rewards)
            self.add_tasks(CALIBRATION_ENV, new)

    def metrics(self) -> dict[str, float]:
        if self.harvester is None:
            return {}
        return {
            "calibration/harvested_tasks": self.harvester.added,
            "calibration/pool": len(self.pools[CALIBRATION_ENV]),
        }

    def state_dict(self) -> tuple[dict[str, dict[str, Any]], dict[str, list[Task]]]:
        """(sampler states, tasks added during the run) for the controller state."""
        return {name: s.state_dict() for name, s in self.samplers.items()}, self.added

    def load_state_dict(self, samplers: dict[str, dict[str, Any]], added: dict[str, list[Task]]) -> None:
        self.added = {name: list(tasks) for name, tasks in added.items()}
        for name, tasks in self.added.items():
            self.pools[name].update({task.id: task for task in tasks})
        if self.harvester is not None:
            self.harvester.restore(self.added.get(CALIBRATION_ENV, []))
        for name, sampler in self.samplers.items():
            sampler.load_state_dict(samplers[name])
