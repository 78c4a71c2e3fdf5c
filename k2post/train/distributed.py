"""Process-group setup for the SFT trainer: one process by default, torchrun-style env when given.

`prepare_env()` fills what DeepSpeed needs when nothing launched us (RANK=0, WORLD_SIZE=1,
LOCAL_RANK=0, MASTER_ADDR=127.0.0.1, a free MASTER_PORT), selects DeepSpeed's CPU accelerator
when no GPU is visible (DS_ACCELERATOR=cpu) and turns off torch.compile (TORCHDYNAMO_DISABLE=1).
Variables already set (torchrun, `deepspeed` launcher) are kept; the launcher ones we set are
removed again at shutdown (a child process must not inherit a stale MASTER_PORT).
`init_distributed` starts the default process group (gloo on CPU, nccl on GPU) unless one
exists; `shutdown_distributed` runs a barrier and destroys the group it created (without that,
gloo can abort at exit with "terminate called without an active exception") through
`deepspeed.comm`, which also drops DeepSpeed's cached subgroups, so a later run in the same
process starts cleanly.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class DistInfo:
    """This process's place in the data-parallel group."""

    rank: int
    world_size: int
    local_rank: int
    owns_group: bool  # this process created the default group (and destroys it at the end)
    env_added: tuple[str, ...] = ()  # launcher variables prepare_env set (removed again at shutdown)

    @property
    def is_main(self) -> bool:
        """Rank 0 writes files and prints."""
        return self.rank == 0


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()


LAUNCHER_DEFAULTS = (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"))


def prepare_env() -> tuple[str, ...]:
    """Set the launcher variables DeepSpeed reads, unless a launcher already did; returns the names set."""
    added = {key: value for key, value in LAUNCHER_DEFAULTS if key not in os.environ}
    if os.environ.get("WORLD_SIZE", "1") == "1" and "MASTER_PORT" not in os.environ:
        added["MASTER_PORT"] = str(free_port())
    for key, value in (("TORCHDYNAMO_DISABLE", "1"), ("DS_ACCELERATOR", None if _cuda_visible() else "cpu")):
        if value is not None and key not in os.environ:
            added[key] = value
    os.environ.update(added)
    return tuple(added)


def resolve_backend(backend: str) -> str:
    """'auto' -> nccl with CUDA, gloo otherwise."""
    if backend != "auto":
        return backend
    return "nccl" if _cuda_visible() else "gloo"


def init_distributed(backend: str = "auto") -> DistInfo:
    """Start (or join) the default process group; returns this process's rank info."""
    import torch.distributed as dist

    owns = not dist.is_initialized()
    added = prepare_env() if owns else ()
    if owns:
        import deepspeed

        _forget_stale_deepspeed_groups()
        deepspeed.init_distributed(dist_backend=resolve_backend(backend))
    return DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")), owns, added)


def _forget_stale_deepspeed_groups() -> None:
    """Drop DeepSpeed's cached groups of a default group someone else destroyed (e.g. a vLLM engine in this
    process): a new engine would otherwise use them ("Group ... is not registered")."""
    from deepspeed.utils import groups

    release = getattr(groups, "_release_process_group_references", None)
    if release is not None:
        release(None)


def barrier() -> None:
    """A barrier over the default group (no-op without one)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def shutdown_distributed(info: DistInfo) -> None:
    """Barrier, destroy the default group if this process created it, drop the launcher variables we set."""
    import torch.distributed as dist

    if info.owns_group and dist.is_initialized():
        import deepspeed.comm

        dist.barrier()
        deepspeed.comm.destroy_process_group()  # also releases DeepSpeed's cached subgroups
    for key in info.env_added:
        if key not in ("TORCHDYNAMO_DISABLE", "DS_ACCELERATOR"):  # read once at import: keep them consistent
            os.environ.pop(key, None)


def all_reduce_sum(values: list[float]) -> list[float]:
    """Sum `values` over ranks (float64; identity in a single process)."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return list(values)
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return tensor.cpu().tolist()
