"""The config sections SFT and RL share: the lr schedule and checkpointing (`schedule:` and `checkpoint:`).

    schedule: {kind: cosine, warmup_steps: 10, min_lr_ratio: 0.1}
    checkpoint: {every: 100, keep: 2}

SFT counts both in optimizer steps, RL in iterations for `checkpoint` and in optimizer steps for `schedule`.
Each run config gives its own defaults (`SFTConfig`, `RLConfig`); the classes are the same.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from k2post.config.base import K2Config


class LRScheduleConfig(K2Config):
    """The learning-rate schedule: linear warmup, then constant or cosine decay (`k2post.train.schedule`)."""

    kind: Literal["cosine", "constant"] = Field(
        "cosine",
        description="After warmup: cosine decay from optim.lr to optim.lr * min_lr_ratio, or constant optim.lr.",
    )
    warmup_steps: int = Field(0, ge=0, description="Linear warmup from 0 to optim.lr over this many optimizer steps.")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Cosine schedule: final lr = optim.lr * min_lr_ratio.")


class CheckpointConfig(K2Config):
    """Resumable checkpoints under run_dir/checkpoints/, written atomically (`k2post.train.checkpoint`)."""

    every: int = Field(
        100,
        ge=0,
        description="Write a checkpoint every N optimizer steps (SFT) or iterations (RL); 0: only at the end.",
    )
    keep: int = Field(2, ge=1, description="Newest checkpoints kept; older ones are deleted.")


# Keys of the runs' `train:` sections that moved into the shared sections: old key -> where it lives now.
MOVED_TRAIN_KEYS = {
    "lr_schedule": "schedule.kind",
    "warmup_steps": "schedule.warmup_steps",
    "min_lr_ratio": "schedule.min_lr_ratio",
    "save_every": "checkpoint.every",
    "keep_checkpoints": "checkpoint.keep",
}
