"""Prompt sampling from a task pool: prioritized by failure rate (K1.5) or a curriculum by difficulty.

    sampler = PromptSampler(task_ids, PromptSamplingConfig(strategy="prioritized"), difficulty=None, seed=0)
    batch = sampler.sample(8, iteration)         # ids, without replacement within a batch
    sampler.update({task_id: success_rate, ...}) # after scoring

Prioritized: weight = max(min_weight, 1 - success rate) (never-tried tasks assume `prior_success`).
Curriculum: tasks sorted easy -> hard; at iteration i the easiest share
curriculum_start + (1 - curriculum_start) * i / curriculum_iterations is open, sampled uniformly.
The sampler's state (success rates, RNG) round-trips through `state_dict` for resume.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from k2post.rl.config import PromptSamplingConfig


def priority_weights(success: Sequence[float | None], cfg: PromptSamplingConfig) -> list[float]:
    """Sampling weight per task from its success rate (None = never tried)."""
    return [max(cfg.min_weight, 1.0 - (cfg.prior_success if s is None else s)) for s in success]


def curriculum_open(n: int, cfg: PromptSamplingConfig, iteration: int) -> int:
    """How many of the `n` (easiest-first) tasks are open at `iteration` (at least one)."""
    share = cfg.curriculum_start + (1.0 - cfg.curriculum_start) * min(1.0, iteration / cfg.curriculum_iterations)
    return max(1, min(n, round(share * n)))


def weighted_without_replacement(
    rng: random.Random, items: Sequence[str], weights: Sequence[float], k: int
) -> list[str]:
    """k distinct items drawn with probability proportional to weight (Efraimidis-Spirakis keys)."""
    if k > len(items):
        raise ValueError(f"asked for {k} tasks from a pool of {len(items)}")
    keys = [(rng.random() ** (1.0 / w), item) for item, w in zip(items, weights)]
    return [item for _, item in sorted(keys, reverse=True)[:k]]


class PromptSampler:
    """Draws task ids per iteration and tracks their success rates."""

    def __init__(
        self,
        task_ids: Sequence[str],
        cfg: PromptSamplingConfig,
        difficulty: Mapping[str, float] | None = None,
        seed: int = 0,
    ):
        if len(set(task_ids)) != len(task_ids):
            raise ValueError("task ids in the sampling pool must be unique")
        if cfg.strategy == "curriculum" and difficulty is None:
            raise ValueError("sampling.strategy: curriculum needs a difficulty per task (or use prioritized/uniform)")
        self.cfg = cfg
        self.ids = sorted(task_ids, key=lambda t: (difficulty or {}).get(t, 0.0)) if difficulty else list(task_ids)
        self.success: dict[str, float] = {}
        self.rng = random.Random(seed)

    def sample(self, k: int, iteration: int) -> list[str]:
        """k distinct task ids for this iteration."""
        if self.cfg.strategy == "curriculum":
            pool = self.ids[: curriculum_open(len(self.ids), self.cfg, iteration)]
            return weighted_without_replacement(self.rng, pool, [1.0] * len(pool), min(k, len(pool)))
        weights = (
            [1.0] * len(self.ids)
            if self.cfg.strategy == "uniform"
            else priority_weights([self.success.get(t) for t in self.ids], self.cfg)
        )
        return weighted_without_replacement(self.rng, self.ids, weights, k)

    def add(self, task_ids: Sequence[str]) -> int:
        """Grow the pool by new task ids (ones already in it are skipped); returns how many were added.
        Curriculum pools keep their order: new ids go last (hardest)."""
        known = set(self.ids)
        fresh = [t for t in dict.fromkeys(task_ids) if t not in known]
        self.ids.extend(fresh)
        return len(fresh)

    def update(self, success_rates: Mapping[str, float]) -> None:
        """Record the latest success rate of tasks just played."""
        unknown = sorted(set(success_rates) - set(self.ids))
        if unknown:
            raise KeyError(f"success rates for tasks not in the pool: {unknown[:3]}")
        self.success.update({t: float(s) for t, s in success_rates.items()})

    def state_dict(self) -> dict[str, Any]:
        return {"success": dict(self.success), "rng": self.rng.getstate(), "ids": list(self.ids)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.success = dict(state["success"])
        if "ids" in state:
            self.ids = list(state["ids"])
        rng_state = state["rng"]
        self.rng.setstate(
            (rng_state[0], tuple(rng_state[1]), rng_state[2]) if isinstance(rng_state, list) else rng_state
        )
