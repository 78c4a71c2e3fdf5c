"""Where every parameter's elements live inside DeepSpeed ZeRO's flat fp32 partitions.

Under ZeRO, DeepSpeed hands the client optimizer one flat 1-D fp32 tensor per param group
(per sub-group at stage 3): this rank's *partition*. Muon needs whole matrices, so we record,
for each original parameter, which runs of its (row-major) elements sit where in which
rank's partition. All ranks' partitions of a group have the same length, so one
`all_gather` of a partition-shaped tensor gives every rank every piece, and
`assemble_full` rebuilds any parameter from them.

Layouts (P = partition length, R = world size):
- ZeRO-1/2 (`stage_1_and_2.py`): the group's params are concatenated (with DeepSpeed's
  alignment padding) into one flat buffer of R * P elements; rank r owns
  [r * P, (r + 1) * P). A parameter at flat [s, s + n) is cut where it crosses those bounds.
- ZeRO-3 (`stage3.py`): every parameter is split on its own into R chunks of
  p = ceil(n / R) elements (the last one padded); rank r's partition is the concatenation of
  its chunk of each parameter, so parameter k sits at the same offset o_k on every rank and
  rank r holds its elements [r * p, min((r + 1) * p, n)).

The pure layout math (`zero12_slots`, `zero3_slots`, `assemble_full`, `row_segments`) has no
DeepSpeed dependency; `zero12_flats` / `zero3_flats` read a live ZeRO optimizer.

Tests: `python -m pytest tests/k2post/optim/test_deepspeed_muon.py -q -m "not slow"`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@dataclass(frozen=True)
class Piece:
    """`numel` consecutive elements of a parameter held by rank `rank`.

    Parameter elements [param_offset, param_offset + numel) (flattened, row-major) are
    partition elements [part_offset, part_offset + numel) of rank `rank`.
    """

    rank: int
    part_offset: int
    param_offset: int
    numel: int


@dataclass(frozen=True)
class ParamSlot:
    """One original parameter inside a flat group: its name, shape and pieces (all ranks)."""

    name: str
    shape: tuple[int, ...]
    pieces: tuple[Piece, ...]

    @property
    def numel(self) -> int:
        """Number of elements of the full parameter."""
        return math.prod(self.shape)

    def local_pieces(self, rank: int) -> tuple[Piece, ...]:
        """The pieces that rank `rank` holds (empty if it holds none of this parameter)."""
        return tuple(piece for piece in self.pieces if piece.rank == rank)


@dataclass(frozen=True)
class FlatLayout:
    """The slots of one flat partition (ZeRO-1/2: a group; ZeRO-3: a sub-group), seen from `rank`."""

    slots: tuple[ParamSlot, ...]
    partition_numel: int
    world_size: int
    rank: int

    def local_slots(self) -> tuple[ParamSlot, ...]:
        """Slots with at least one element in this rank's partition."""
        return tuple(slot for slot in self.slots if slot.local_pieces(self.rank))


@dataclass
class BoundFlat:
    """A live flat fp32 partition: the tensor DeepSpeed passes to `step`, its layout and DP group.

    `lp_flat` is the matching low-precision (model dtype) partition with the same layout,
    `index` the group (ZeRO-1/2) or sub-group (ZeRO-3) index in the ZeRO optimizer.
    """

    flat: Tensor  # [P] fp32 master partition (identity = how `step` recognises it)
    layout: FlatLayout
    process_group: Any
    lp_flat: Tensor  # [P] model-dtype partition, same layout
    index: int


def zero12_slots(
    names: Sequence[str],
    shapes: Sequence[tuple[int, ...]],
    offsets: Sequence[int],
    partition_numel: int,
    world_size: int,
) -> tuple[ParamSlot, ...]:
    """Slots of a ZeRO-1/2 group: param k occupies flat [offsets[k], offsets[k] + numel_k)."""
    slots = []
    for name, shape, start in zip(names, shapes, offsets, strict=True):
        end = start + math.prod(shape)
        pieces = []
        for rank in range(world_size):
            lo, hi = max(start, rank * partition_numel), min(end, (rank + 1) * partition_numel)
            if hi > lo:
                pieces.append(Piece(rank, lo - rank * partition_numel, lo - start, hi - lo))
        slots.append(ParamSlot(name, tuple(shape), tuple(pieces)))
    return tuple(slots)


def zero3_slots(names: Sequence[str], shapes: Sequence[tuple[int, ...]], world_size: int) -> tuple[ParamSlot, ...]:
    """Slots of a ZeRO-3 sub-group: each param split on its own into `world_size` equal chunks."""
    slots, offset = [], 0
    for name, shape in zip(names, shapes, strict=True):
        numel = math.prod(shape)
        chunk = -(-numel // world_size)  # ceil: DeepSpeed's partition_numel()
        pieces = []
        for rank in range(world_size):
            lo, hi = rank * chunk, min((rank + 1) * chunk, numel)
            if hi > lo:
                pieces.append(Piece(rank, offset, lo, hi - lo))
        slots.append(ParamSlot(name, tuple(shape), tuple(pieces)))
        offset += chunk
    return tuple(slots)


def assemble_full(slot: ParamSlot, parts: Sequence[Tensor]) -> Tensor:
    """The full parameter [*slot.shape] from every rank's partition-shaped tensor `parts[r]` [P]."""
    full = torch.empty(slot.numel, dtype=parts[0].dtype, device=parts[0].device)  # [n]
    for piece in slot.pieces:
        source = parts[piece.rank].narrow(0, piece.part_offset, piece.numel)
        full.narrow(0, piece.param_offset, piece.numel).copy_(source)
    return full.view(slot.shape)


def partition_tensors(
    slots: Sequence[ParamSlot], fulls: Sequence[Tensor], partition_numel: int, world_size: int
) -> list[Tensor]:
    """The inverse of `assemble_full`: every rank's partition [P] holding `fulls` (zeros elsewhere)."""
    parts = [torch.zeros(partition_numel, dtype=fulls[0].dtype, device=fulls[0].device) for _ in range(world_size)]
    for slot, full in zip(slots, fulls, strict=True):
        flat = full.reshape(-1)  # [n]
        for piece in slot.pieces:
            source = flat.narrow(0, piece.param_offset, piece.numel)
            parts[piece.rank].narrow(0, piece.part_offset, piece.numel).copy_(source)
    return parts


def row_segments(slot: ParamSlot, rows: slice, rank: int) -> list[tuple[int, int, int]]:
    """(part_offset, param_offset, numel) runs of rows `rows` (dim 0) that rank `rank` holds."""
    start, stop, step = rows.indices(slot.shape[0])
    if step != 1:
        raise ValueError(f"row slice {rows} of {slot.name} has step {step}; only contiguous rows are supported")
    row_numel = slot.numel // slot.shape[0] if slot.shape[0] else 0
    lo_row, hi_row = start * row_numel, stop * row_numel  # flat element range of the rows
    segments = []
    for piece in slot.local_pieces(rank):
        lo = max(lo_row, piece.param_offset)
        hi = min(hi_row, piece.param_offset + piece.numel)
        if hi > lo:
            segments.append((piece.part_offset + lo - piece.param_offset, lo, hi - lo))
    return segments


def all_gather_parts(local: Tensor, process_group: Any, world_size: int) -> list[Tensor]:
    """Every rank's copy of the partition-shaped `local` [P] (a list of `world_size` tensors)."""
    if world_size == 1:
        return [local]
    parts = [torch.empty_like(local) for _ in range(world_size)]
    torch.distributed.all_gather(parts, local.contiguous(), group=process_group)
    return parts


def gather_full(bound: BoundFlat, local: Tensor) -> dict[str, Tensor]:
    """Every full parameter of `bound`, by name, from each rank's partition-shaped `local` [P] (a collective)."""
    parts = all_gather_parts(local.detach(), bound.process_group, bound.layout.world_size)
    return {slot.name: assemble_full(slot, parts) for slot in bound.layout.slots}


# --------------------------------------------------------------------------- DeepSpeed readers


def _name_of(param: Tensor, names_by_id: Mapping[int, str]) -> str:
    """The name of `param` (a model parameter object) or a clear error."""
    name = names_by_id.get(id(param))
    if name is None:
        raise KeyError(
            f"a parameter of shape {tuple(getattr(param, 'ds_shape', param.shape))} in the ZeRO optimizer is not in "
            "the client optimizer's param groups: build the engine from the same optimizer you bind"
        )
    return name


def zero12_flats(zero: Any, names_by_id: Mapping[int, str]) -> list[BoundFlat]:
    """One `BoundFlat` per group of a ZeRO-1/2 `DeepSpeedZeroOptimizer`."""
    flats = []
    for i, flat in enumerate(zero.single_partition_of_fp32_groups):
        group = zero.real_dp_process_group[i]
        world_size = torch.distributed.get_world_size(group=group)
        rank = torch.distributed.get_rank(group=group)
        params = zero.round_robin_bit16_groups[i]
        shapes = [tuple(meta.shape) for meta in zero.round_robin_bit16_meta[i]]
        names = [_name_of(param, names_by_id) for param in params]
        partition_numel = int(zero.partition_size[i])
        if partition_numel * world_size != zero.bit16_groups_flat[i].numel() or flat.numel() != partition_numel:
            raise RuntimeError(f"ZeRO group {i}: unexpected partition sizes; DeepSpeed's layout changed")
        slots = zero12_slots(names, shapes, zero.round_robin_bit16_offsets[i], partition_numel, world_size)
        layout = FlatLayout(slots, partition_numel, world_size, rank)
        lp_flat = zero.parallel_partitioned_bit16_groups[i][rank]
        flats.append(BoundFlat(flat, layout, group, lp_flat, i))
    return flats


def zero3_flats(zero: Any, names_by_id: Mapping[int, str]) -> list[BoundFlat]:
    """One `BoundFlat` per sub-group of a ZeRO-3 `DeepSpeedZeroOptimizer_Stage3`."""
    flats = []
    for i, flat in enumerate(zero.fp32_partitioned_groups_flat):
        if zero.fp16_partitioned_groups_flat[i] is None or flat.numel() == 0:
            raise ValueError("ZeRO-3 with offload_param / NVMe-swapped sub-groups is not supported by ZeroMuonClip")
        group = zero.sub_group_process_groups[i]
        world_size = torch.distributed.get_world_size(group=group)
        rank = torch.distributed.get_rank(group=group)
        params = zero.fp16_groups[i]
        names = [_name_of(param, names_by_id) for param in params]
        shapes = [tuple(param.ds_shape) for param in params]
        slots = zero3_slots(names, shapes, world_size)
        partition_numel = int(zero.fp16_partitioned_groups_flat_numel[i])
        if sum(param.partition_numel() for param in params) != partition_numel or flat.numel() != partition_numel:
            raise RuntimeError(f"ZeRO-3 sub-group {i}: unexpected partition sizes; DeepSpeed's layout changed")
        layout = FlatLayout(slots, partition_numel, world_size, rank)
        flats.append(BoundFlat(flat, layout, group, zero.fp16_partitioned_groups_flat[i], i))
    return flats
