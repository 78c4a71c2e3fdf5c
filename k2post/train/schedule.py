"""The learning-rate schedule SFT and RL share: a pure function of the step (so resuming needs only the step).

Step `s` counts optimizer steps from 0. Warmup: lr = peak * (s + 1) / warmup_steps for
s < warmup_steps. After it, `constant` keeps the peak; `cosine` decays from the peak at
s = warmup_steps towards peak * min_lr_ratio (reached one step after the last).
"""

from __future__ import annotations

import math

from typing import Any

from k2post.train.config import LRScheduleConfig


def lr_factor(step: int, total_steps: int, cfg: LRScheduleConfig) -> float:
    """Multiplier of the peak lr (optim.lr) for optimizer step `step` of `total_steps`."""
    if step < 0 or step >= total_steps:
        raise ValueError(f"step {step} is outside the run's steps 0..{total_steps - 1}")
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.kind == "constant":
        return 1.0
    progress = (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps)
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def set_lr(engine: Any, lr: float) -> None:
    """Set the lr of every param group of a DeepSpeed engine's ZeroMuonClip (ZeRO keeps the same group dicts)."""
    from k2post.optim.deepspeed_muon import find_zero_muon_clip

    for group in find_zero_muon_clip(engine).param_groups:
        group["lr"] = lr
