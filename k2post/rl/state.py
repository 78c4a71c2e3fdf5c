"""What an RL run must keep to resume, and its checkpoints: run_dir/checkpoints/iter-N, written atomically.

    state = ControllerState.fresh(samples_per_prompt=8)
    path = state.save(run_dir, iteration, trainers, rollouts, keep=3)   # trainer state + HF model + this state
    state = ControllerState.load(latest_checkpoint(run_dir), trainers, rollouts)

A checkpoint is complete once `controller.pkl` is in it: `save` writes into `.iter-N.tmp`, fsyncs the state
file and renames the directory (`k2post.train.checkpoint.publish`), then prunes to the newest `keep`.
`trainers` and `rollouts` are the facades of `k2post/rl/actors.py` (or the unit tests' fakes).
"""

from __future__ import annotations

import os
import pickle
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from k2post.envs.base import Task
from k2post.rl import batch as rb
from k2post.rl.critic_loop import PendingGroups
from k2post.train import checkpoint as checkpoints

CHECKPOINTS, STATE_FILE, ITERATION_PREFIX = checkpoints.CHECKPOINTS_DIR, "controller.pkl", "iter"


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete iter-N checkpoint (it has controller.pkl), or None."""
    return checkpoints.latest_checkpoint(run_dir, ITERATION_PREFIX, (STATE_FILE,))


def checkpoint_dir(run_dir: Path, iteration: int) -> Path:
    return run_dir / CHECKPOINTS / f"{ITERATION_PREFIX}-{iteration}"


@dataclass
class ControllerState:
    """The controller's side of a checkpoint (pickled) besides the trainer engine state."""

    iteration: int = 0  # iterations completed
    step: int = 0  # optimizer steps taken
    samplers: dict[str, dict[str, Any]] = field(default_factory=dict)  # prompt sampler state per env
    book: rb.GroupBook | None = None
    paused: list[list[Any]] = field(default_factory=list)  # per rollout replica
    group_replica: dict[str, int] = field(default_factory=dict)  # open group -> replica that holds it
    pending: PendingGroups | None = None  # finished episodes of group-scored envs waiting for their group
    added_tasks: dict[str, list[Task]] = field(default_factory=dict)  # tasks added to pools during the run

    @classmethod
    def fresh(cls, samples_per_prompt: int) -> ControllerState:
        return cls(book=rb.GroupBook(samples_per_prompt), pending=PendingGroups(samples_per_prompt))

    def drop_replica(self, replica: int) -> list[str]:
        """Forget the open groups a dead replica held (their episodes died with it); returns their ids."""
        lost = [g for g, r in self.group_replica.items() if r == replica]
        self.book.drop(lost)
        self.pending.drop(lost)
        for group_id in lost:
            del self.group_replica[group_id]
        return lost

    def save(self, run_dir: Path, iteration: int, trainers: Any, rollouts: Any, keep: int) -> Path:
        """checkpoints/iter-N atomically: trainer engine state + HF model (trainers), paused episodes, this state;
        then prune to the newest `keep`. The caller has the trainers' weights on their device."""
        target = checkpoint_dir(run_dir, iteration)
        tmp = target.with_name(f".{target.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            with checkpoints.disk_full_is_one_line(target):
                trainers.save(str(tmp))
                self.paused = rollouts.export_paused()
                with open(tmp / STATE_FILE, "wb") as handle:
                    pickle.dump(self, handle)
                    handle.flush()
                    os.fsync(handle.fileno())
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # a partial checkpoint frees its space; the older ones stay
            raise
        checkpoints.publish(tmp, target)
        checkpoints.prune_checkpoints(run_dir, keep, ITERATION_PREFIX, (STATE_FILE,))
        return target

    @staticmethod
    def load(checkpoint: Path, trainers: Any, rollouts: Any) -> ControllerState:
        """The state `save` wrote; the trainers load their engine state and the replicas their paused episodes."""
        with open(checkpoint / STATE_FILE, "rb") as handle:
            state = pickle.load(handle)  # our own file, written by save()
        trainers.load(str(checkpoint))
        rollouts.import_paused(state.paused)
        return state


def publish_final(run_dir: Path, iteration: int) -> Path:
    """run_dir/final: the HF model of checkpoint iter-N (no engine state, RNG or controller state)."""
    final = run_dir / "final"
    shutil.copytree(
        checkpoint_dir(run_dir, iteration),
        final.with_name(".final.tmp"),
        dirs_exist_ok=True,
        ignore=shutil.ignore_patterns("engine", "rng", STATE_FILE),
    )
    checkpoints.publish(final.with_name(".final.tmp"), final)
    return final
