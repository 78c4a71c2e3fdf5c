"""Temperature decay (K2): per task type, from a high exploring temperature to a lower one.

temperature_at(TemperatureScheduleConfig(kind="cosine", start=1.0, end=0.6, decay_iterations=50), iteration=10)
"""

from __future__ import annotations

import math

from k2post.rl.config import TemperatureConfig, TemperatureScheduleConfig


def decay_fraction(kind: str, progress: float) -> float:
    """How far from start to end (0 -> 1) a schedule is at `progress` in [0, 1]."""
    progress = min(1.0, max(0.0, progress))
    if kind == "constant":
        return 0.0
    if kind == "linear":
        return progress
    if kind == "cosine":
        return 0.5 * (1.0 - math.cos(math.pi * progress))
    raise ValueError(
        f"unknown schedule kind {kind!r}; known: constant, linear, cosine (exponential: see temperature_at)"
    )


def temperature_at(cfg: TemperatureScheduleConfig, iteration: int) -> float:
    """The sampling temperature at `iteration` (end value from decay_iterations on)."""
    if cfg.kind == "exponential":  # geometric interpolation: the same ratio every iteration
        progress = min(1.0, max(0.0, iteration / cfg.decay_iterations))
        return cfg.start * (cfg.end / cfg.start) ** progress
    return cfg.start + (cfg.end - cfg.start) * decay_fraction(cfg.kind, iteration / cfg.decay_iterations)


def temperature_for(cfg: TemperatureConfig, task_type: str, iteration: int) -> float:
    """The temperature of a task type at an iteration."""
    return temperature_at(cfg.schedule_for(task_type), iteration)
