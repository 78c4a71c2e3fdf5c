"""What a sender rank registers, how registrations of all ranks merge into planner pieces, and
how sources are materialized during one push.

Three kinds of source:
- a full `torch.Tensor` held by this rank (several ranks may hold the same replicated tensor;
  exactly one of them, the *owner*, copies it);
- a `Shard`: elements [start, start + local.numel()) of the flattened full tensor, the way ZeRO
  partitions parameters; every shard is its own piece, owned by the rank holding it, and the
  receiver reassembles the full tensor;
- a materializer `() -> Tensor | ContextManager[Tensor]` (e.g. `lambda: GatheredParameters(p)`),
  called once per push while its pieces are copied. `collective=True` means every rank must
  register it and every rank calls it, in plan order (needed by ZeRO-3 gathers); otherwise only
  the owner calls it.
Only small metadata dicts are exchanged between ranks (all_gather_object), never tensors.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ContextManager

import torch

from k2post_checkpoint_engine.meta import PieceSpec, dtype_from_str, dtype_to_str, itemsize_of

Materializer = Callable[[], "torch.Tensor | ContextManager[torch.Tensor]"]


@dataclass(frozen=True)
class Shard:
    """Elements [start, start + local.numel()) of the flattened tensor of shape `full_shape`."""

    local: torch.Tensor
    full_shape: Sequence[int]
    start: int


@dataclass
class Registration:
    """One name registered on this rank; `summary()` is what other ranks see."""

    name: str
    kind: str  # "full" | "shard" | "fn"
    dtype: str  # source dtype
    shape: tuple[int, ...]  # full tensor shape
    source: Any = field(repr=False)
    start: int = 0
    numel: int = 0
    owner: int | None = None
    collective: bool = False

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "dtype": self.dtype, "shape": list(self.shape),
                "start": self.start, "numel": self.numel, "owner": self.owner,
                "collective": self.collective}  # fmt: skip


def _shard_registration(name: str, shard: Shard) -> Registration:
    shape = tuple(int(s) for s in shard.full_shape)
    numel = shard.local.numel()
    if shard.start < 0 or shard.start + numel > math.prod(shape):
        raise ValueError(
            f"tensor {name!r}: shard elements [{shard.start}, {shard.start + numel}) exceed full shape {shape}"
        )
    dtype = dtype_to_str(shard.local.dtype, name)
    return Registration(name, "shard", dtype, shape, shard.local, start=shard.start, numel=numel)


def make_registration(
    name: str, source: Any, shape: Sequence[int] | None, dtype: torch.dtype | str | None,
    owner: int | None, collective: bool, world_size: int,
) -> Registration:  # fmt: skip
    """Validate one `register()` call and turn it into a Registration."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"tensor name must be a non-empty string, got {name!r}")
    if owner is not None and not 0 <= owner < world_size:
        raise ValueError(f"tensor {name!r}: owner {owner} is not a rank in [0, {world_size})")
    if isinstance(source, Shard):
        if owner is not None or collective:
            raise ValueError(f"tensor {name!r}: a Shard is owned by the rank holding it (no owner=/collective=)")
        return _shard_registration(name, source)
    if isinstance(source, torch.Tensor):
        full = tuple(source.shape)
        if shape is not None and tuple(shape) != full:
            raise ValueError(f"tensor {name!r}: shape= {list(shape)} disagrees with the tensor's {list(full)}")
        reg_dtype = dtype_to_str(source.dtype, name)
        return Registration(name, "full", reg_dtype, full, source, numel=source.numel(), owner=owner)
    if callable(source):
        if shape is None or dtype is None:
            raise ValueError(f"tensor {name!r}: a materializer needs shape= and dtype=")
        dims = tuple(int(s) for s in shape)
        fn_dtype = dtype_to_str(dtype, name)
        return Registration(
            name, "fn", fn_dtype, dims, source, numel=math.prod(dims), owner=owner, collective=collective
        )
    raise TypeError(f"tensor {name!r}: source must be a Tensor, Shard or callable, got {type(source).__name__}")


def target_dtype(src_dtype: str, cast_to: str | None, name: str) -> str:
    """Dtype in the buffer: floating tensors are cast to `cast_to` if set; others keep theirs."""
    if cast_to is None or not dtype_from_str(src_dtype, name).is_floating_point:
        return src_dtype
    return dtype_to_str(cast_to, name)


def _check_consistent(name: str, entries: list[tuple[int, dict[str, Any]]], world_size: int) -> None:
    first_rank, first = entries[0]
    for rank, r in entries[1:]:
        for key in ("kind", "dtype", "shape", "owner", "collective"):
            if r[key] != first[key]:
                raise ValueError(
                    f"tensor {name!r}: {key} differs between rank {first_rank} ({first[key]!r}) "
                    f"and rank {rank} ({r[key]!r})"
                )
    if first["collective"] and len(entries) != world_size:
        missing = sorted(set(range(world_size)) - {rank for rank, _ in entries})
        raise ValueError(f"tensor {name!r}: collective materializer not registered on ranks {missing}")


def _choose_owner(name: str, entries: list[tuple[int, dict[str, Any]]], load_nbytes: list[int]) -> int:
    ranks = [rank for rank, _ in entries]
    hint = entries[0][1]["owner"]
    if hint is not None:
        if hint not in ranks:
            raise ValueError(f"tensor {name!r}: owner={hint} but rank {hint} did not register it")
        return hint
    return min(ranks, key=lambda r: (load_nbytes[r], r))


def merge_registrations(per_rank: Sequence[Sequence[dict[str, Any]]], cast_to: str | None) -> list[PieceSpec]:
    """All ranks' registration summaries -> planner pieces (deterministic; same result on every rank).

    Names are taken in order of first appearance (rank 0's registrations first). Replicated
    tensors go to the least-loaded registering rank unless `owner` was given.
    """
    world_size = len(per_rank)
    entries: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for rank, regs in enumerate(per_rank):
        for r in regs:
            entries.setdefault(r["name"], []).append((rank, r))
    load_nbytes, pieces = [0] * world_size, []
    for name, ents in entries.items():
        _check_consistent(name, ents, world_size)
        first = ents[0][1]
        dtype, shape = target_dtype(first["dtype"], cast_to, name), tuple(first["shape"])
        if first["kind"] == "shard":
            for rank, r in ents:
                pieces.append(PieceSpec(name, dtype, shape, rank, r["start"], r["numel"]))
                load_nbytes[rank] += r["numel"] * itemsize_of(dtype, name)
        else:
            owner = _choose_owner(name, ents, load_nbytes)
            pieces.append(PieceSpec(name, dtype, shape, owner))
            load_nbytes[owner] += math.prod(shape) * itemsize_of(dtype, name)
    return pieces


class MaterializedSources:
    """Per-push view of this rank's sources: opens materializers on first use, closes them after
    their last piece (`done`), and checks every tensor against its registration."""

    def __init__(self, regs: dict[str, Registration], pieces_per_name: dict[str, int]) -> None:
        self._regs, self._left = regs, dict(pieces_per_name)
        self._open: dict[str, tuple[torch.Tensor, contextlib.ExitStack]] = {}

    def _materialize(self, reg: Registration) -> tuple[torch.Tensor, contextlib.ExitStack]:
        stack = contextlib.ExitStack()
        out = reg.source()
        tensor = out if isinstance(out, torch.Tensor) else stack.enter_context(out)
        if not isinstance(tensor, torch.Tensor):
            stack.close()
            raise TypeError(f"tensor {reg.name!r}: materializer produced {type(tensor).__name__}, not a Tensor")
        return tensor, stack

    def get(self, name: str) -> torch.Tensor:
        if name in self._open:
            return self._open[name][0]
        reg = self._regs.get(name)
        if reg is None:
            raise KeyError(f"tensor {name!r} is in the plan but not registered on this rank")
        tensor, stack = self._materialize(reg) if reg.kind == "fn" else (reg.source, contextlib.ExitStack())
        self._open[name] = (tensor, stack)
        check_source(reg, tensor)
        return tensor

    def done(self, name: str) -> None:
        self._left[name] -= 1
        if self._left[name] == 0 and name in self._open:
            self._open.pop(name)[1].close()

    def close_all(self) -> None:
        while self._open:
            self._open.popitem()[1][1].close()


def check_source(reg: Registration, tensor: torch.Tensor) -> None:
    """The live tensor must still match what was registered (shape/numel and dtype)."""
    if dtype_to_str(tensor.dtype, reg.name) != reg.dtype:
        raise ValueError(f"tensor {reg.name!r}: source dtype is now {tensor.dtype}, registered {reg.dtype}")
    ok = tensor.numel() == reg.numel if reg.kind == "shard" else tuple(tensor.shape) == reg.shape
    if not ok:
        raise ValueError(f"tensor {reg.name!r}: source shape is now {list(tensor.shape)}, registered {list(reg.shape)}")
