"""SFT checkpoints: HF model dirs that vLLM loads, plus the engine state a run resumes from.

Layout of `<run_dir>/checkpoints/step-N/` (and `<run_dir>/final/`, which has no engine/ or rng/):

    config.json, model.safetensors, generation_config.json   the model (gathered under ZeRO-3)
    tokenizer.json, tokenizer_config.json, chat_template.jinja   the tokenizer with the K2 template
    trainer_state.json   step, token counts, data fingerprint, world size, ZeRO stage, last eval loss
    engine/              DeepSpeed `save_checkpoint` (module, ZeroMuonClip state; every rank writes its part)
    rng/rank<R>.pt       torch + python RNG states per rank

Writes are atomic: everything goes into `.<name>.tmp` next to the target, and rank 0 renames
it into place after a barrier, so a crash never leaves a half-written `step-N` behind and
`latest_checkpoint` only ever sees complete ones. A write that runs out of disk (ENOSPC, or a failed torch
write while the disk is all but full: `is_disk_full`) is DiskFullError, one line naming the run dir; the
partial temp dir is removed and the checkpoints before it are kept. Resume loads the engine state with
DeepSpeed's `load_checkpoint` (same world size and ZeRO stage) and continues at the saved step;
the data stream and the lr schedule are functions of the step (`batching`, `schedule`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from k2post.command import UserError
from k2post.train.distributed import DistInfo, barrier

STATE_FILE = "trainer_state.json"
ENGINE_DIR, ENGINE_TAG = "engine", "state"
CHECKPOINTS_DIR = "checkpoints"
SFT_MARKERS = (STATE_FILE, ENGINE_DIR)
NO_SPACE_MARKERS = ("No space left on device", "Disk quota exceeded", "StorageFull", "os error 28")
LOW_FREE_BYTES = 64 << 20  # below this, a failed write is taken for a full disk (torch does not say why)
"""What a complete SFT step-N checkpoint holds (RL's iter-N: its controller state, `k2post.rl.state`)."""


class DiskFullError(UserError):
    """A checkpoint could not be written because the run dir's disk is full (one line; the older ones are kept)."""


class ResumeError(ValueError):
    """A checkpoint cannot continue this run (other data, world size or ZeRO stage)."""


@dataclass
class TrainerState:
    """Where a run stands (trainer_state.json)."""

    step: int
    total_steps: int
    tokens: int
    label_tokens: int
    fingerprint: str
    world_size: int
    zero_stage: int
    eval_loss: float | None = None

    def write(self, directory: Path) -> None:
        """Write trainer_state.json into `directory`."""
        (directory / STATE_FILE).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def read(cls, directory: Path) -> "TrainerState":
        """Read trainer_state.json from `directory`."""
        return cls(**json.loads((directory / STATE_FILE).read_text()))


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    """`<run_dir>/checkpoints/step-<step>`."""
    return run_dir / CHECKPOINTS_DIR / f"step-{step}"


def complete_checkpoints(
    run_dir: Path, prefix: str = "step", markers: tuple[str, ...] = SFT_MARKERS
) -> list[tuple[int, Path]]:
    """(N, dir) of every complete `<prefix>-N` checkpoint (every marker file or dir in it), oldest first; temp dirs
    and partial dirs are ignored."""
    root, pattern = run_dir / CHECKPOINTS_DIR, re.compile(rf"{re.escape(prefix)}-(\d+)")
    found = []
    for path in root.iterdir() if root.is_dir() else []:
        match = pattern.fullmatch(path.name)
        if match and all((path / marker).exists() for marker in markers):
            found.append((int(match.group(1)), path))
    return sorted(found)


def latest_checkpoint(run_dir: Path, prefix: str = "step", markers: tuple[str, ...] = SFT_MARKERS) -> Path | None:
    """The newest complete checkpoint of the run, or None."""
    found = complete_checkpoints(run_dir, prefix, markers)
    return found[-1][1] if found else None


def prune_checkpoints(
    run_dir: Path, keep: int, prefix: str = "step", markers: tuple[str, ...] = SFT_MARKERS
) -> list[Path]:
    """Delete all but the newest `keep` complete checkpoints; returns the deleted dirs."""
    old = [path for _, path in complete_checkpoints(run_dir, prefix, markers)[:-keep]] if keep > 0 else []
    for path in old:
        shutil.rmtree(path, ignore_errors=True)
    return old


def publish(tmp: Path, target: Path) -> None:
    """Rename the finished `tmp` to `target` (an existing target is replaced)."""
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        os.replace(target, old)
    os.replace(tmp, target)
    shutil.rmtree(old, ignore_errors=True)


def is_disk_full(err: BaseException, free_bytes: int | None) -> bool:
    """Whether a failed checkpoint write ran out of disk: an OSError of ENOSPC / EDQUOT anywhere in its chain, a
    message that says so (safetensors' `StorageFull`, a Ray task error's text), or an OSError / RuntimeError (torch's
    "file write failed") while less than LOW_FREE_BYTES were free on the run dir's file system."""
    seen: set[int] = set()
    chain: BaseException | None = err
    while chain is not None and id(chain) not in seen:
        seen.add(id(chain))
        if isinstance(chain, OSError) and chain.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(marker in str(chain) for marker in NO_SPACE_MARKERS):
            return True
        chain = chain.__cause__ or chain.__context__
    return isinstance(err, (OSError, RuntimeError)) and free_bytes is not None and free_bytes < LOW_FREE_BYTES


def free_bytes(path: Path) -> int | None:
    """Free bytes on the file system of `path` (or its nearest existing parent); None when it cannot be asked."""
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


@contextlib.contextmanager
def disk_full_is_one_line(target: Path) -> Iterator[None]:
    """Re-raise a failed write of checkpoint `target` that ran out of disk as DiskFullError (one line naming the
    run dir); any other error as it is."""
    try:
        yield
    except Exception as err:
        if not is_disk_full(err, free_bytes(target.parent)):
            raise
        run_dir = target.parent.parent if target.parent.name == CHECKPOINTS_DIR else target.parent
        raise DiskFullError(
            f"no space left on the device of run dir {run_dir}: checkpoint {target.name} was not written (the "
            "previous checkpoints are kept): free space, then continue with --resume"
        ) from err


def write_atomically(target: Path, dist: DistInfo, write: Callable[[Path], None]) -> Path:
    """Every rank calls `write(tmp)`; rank 0 then renames tmp to `target`. Collective (barriers). Running out of
    disk is DiskFullError; the partial tmp is removed and the checkpoints before it stay."""
    tmp = target.with_name(f".{target.name}.tmp")
    if dist.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier()
    try:
        with disk_full_is_one_line(target):
            write(tmp)
        barrier()
        if dist.is_main:
            publish(tmp, target)
    finally:
        if dist.is_main:
            shutil.rmtree(tmp, ignore_errors=True)  # only left when write() failed
    barrier()
    return target


def gathered(module: Any, zero_stage: int) -> contextlib.AbstractContextManager:
    """Context in which `module` holds full parameters (ZeRO-3 gathers them; a collective)."""
    if zero_stage != 3:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None)


def save_hf(module: Any, tokenizer: Any, out: Path, zero_stage: int, is_main: bool) -> None:
    """Rank 0 writes the model (safetensors) and tokenizer into `out`; every rank must call it."""
    with gathered(module, zero_stage):
        if is_main:
            module.save_pretrained(out, safe_serialization=True)
            tokenizer.save_pretrained(str(out))


def save_rng(out: Path, rank: int) -> None:
    """This rank's torch and python RNG states."""
    import torch

    (out / "rng").mkdir(exist_ok=True)
    torch.save({"torch": torch.get_rng_state(), "python": random.getstate()}, out / "rng" / f"rank{rank}.pt")


def load_rng(directory: Path, rank: int) -> None:
    """Restore this rank's RNG states (missing file: left as is)."""
    import torch

    path = directory / "rng" / f"rank{rank}.pt"
    if path.is_file():
        states = torch.load(path, weights_only=False)
        torch.set_rng_state(states["torch"])
        random.setstate(states["python"])


def check_resumable(state: TrainerState, fingerprint: str, world_size: int, zero_stage: int, where: Path) -> None:
    """Refuse a checkpoint whose data stream, world size or ZeRO stage differ from this run's."""
    if state.fingerprint != fingerprint:
        raise ResumeError(
            f"{where}: the train data or batch settings changed since this checkpoint (fingerprint {state.fingerprint} "
            f"!= {fingerprint}): resume needs the same data.*, train.seed, micro_batch_size, "
            "gradient_accumulation_steps and world size; start a new run_dir instead"
        )
    if (state.world_size, state.zero_stage) != (world_size, zero_stage):
        raise ResumeError(
            f"{where}: saved with world size {state.world_size} at ZeRO stage {state.zero_stage}, this run has "
            f"{world_size} at stage {zero_stage}: resume with the same ones"
        )


def load_engine_state(engine: Any, directory: Path) -> None:
    """Load module weights and optimizer state saved by `engine.save_checkpoint`."""
    path, _ = engine.load_checkpoint(
        str(directory / ENGINE_DIR), tag=ENGINE_TAG, load_optimizer_states=True, load_lr_scheduler_states=False
    )
    if path is None:
        raise ResumeError(f"{directory}: DeepSpeed found no engine state in {directory / ENGINE_DIR}")
