"""Tensor/bucket metadata, the dtype codec, bucket planning and validation (pure, no I/O).

A *piece* is a flat element range [start, start + numel) of one named tensor; a whole tensor is
one piece, a ZeRO shard or a chunk of a tensor larger than a bucket is one piece each. A bucket
holds pieces of one owner rank at aligned byte offsets. `plan_buckets` is deterministic: given the
same piece list (which every rank gets from the same all-gather) every rank computes the same plan.
The receiver runs `validate_plan` on what it is sent before touching the buffer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from k2post_checkpoint_engine.errors import MetadataError

_DTYPE_NAMES = (
    "float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
    "float8_e5m2fnuz", "complex64", "complex128", "int64", "int32", "int16", "int8", "uint8",
    "uint16", "uint32", "uint64", "bool",
)  # fmt: skip
_STR_TO_DTYPE: dict[str, torch.dtype] = {n: getattr(torch, n) for n in _DTYPE_NAMES if hasattr(torch, n)}
_DTYPE_TO_STR: dict[torch.dtype, str] = {d: n for n, d in _STR_TO_DTYPE.items()}


def dtype_from_str(name: str, tensor: str) -> torch.dtype:
    """'bfloat16' or 'torch.bfloat16' -> torch.bfloat16; unknown -> MetadataError naming `tensor`."""
    key = name[6:] if isinstance(name, str) and name.startswith("torch.") else name
    if not isinstance(key, str) or key not in _STR_TO_DTYPE:
        raise MetadataError(f"tensor {tensor!r}: unknown dtype {name!r}")
    return _STR_TO_DTYPE[key]


def dtype_to_str(dtype: torch.dtype | str, tensor: str) -> str:
    """torch.dtype (or its name) -> canonical name like 'bfloat16'; unknown -> MetadataError."""
    if isinstance(dtype, str):
        return _DTYPE_TO_STR[dtype_from_str(dtype, tensor)]
    if not isinstance(dtype, torch.dtype) or dtype not in _DTYPE_TO_STR:
        raise MetadataError(f"tensor {tensor!r}: unsupported dtype {dtype}")
    return _DTYPE_TO_STR[dtype]


def itemsize_of(dtype: str, tensor: str) -> int:
    return dtype_from_str(dtype, tensor).itemsize


def round_up(n: int, align: int) -> int:
    return (n + align - 1) // align * align


@dataclass(frozen=True)
class TensorMeta:
    """One piece of tensor `name` stored at byte `offset` of a bucket.

    `dtype`/`shape` describe the full tensor as the receiver gets it; the piece covers flat
    elements [start, start + nbytes // itemsize).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    start: int = 0

    @property
    def numel(self) -> int:
        return self.nbytes // itemsize_of(self.dtype, self.name)

    @property
    def full_numel(self) -> int:
        return math.prod(self.shape)

    @property
    def is_whole(self) -> bool:
        return self.start == 0 and self.numel == self.full_numel

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "offset": self.offset,
                "nbytes": self.nbytes, "start": self.start}  # fmt: skip


@dataclass(frozen=True)
class BucketMeta:
    """Bucket `index`: `owner` (group rank) fills it, it goes to IPC slot `index % 2`.

    `nbytes` is the used extent (end of the last piece); `tensors` are its pieces in offset order.
    """

    index: int
    owner: int
    nbytes: int
    tensors: tuple[TensorMeta, ...] = field(default_factory=tuple)

    @property
    def buffer_slot(self) -> int:
        return self.index % 2

    @property
    def payload_nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "owner": self.owner, "nbytes": self.nbytes,
                "tensors": [t.to_dict() for t in self.tensors]}  # fmt: skip


def _as_int(value: Any, what: str, tensor: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise MetadataError(f"tensor {tensor!r}: {what} must be an int, got {value!r}")
    return value


def tensor_meta_from_dict(d: Mapping[str, Any]) -> TensorMeta:
    """Parse one piece from its JSON form; malformed fields -> MetadataError naming the tensor."""
    name = d.get("name") if isinstance(d, Mapping) else None
    if not isinstance(name, str):
        raise MetadataError(f"tensor entry without a string name: {d!r}")
    shape = d.get("shape")
    if not isinstance(shape, list | tuple):
        raise MetadataError(f"tensor {name!r}: shape must be a list, got {shape!r}")
    dims = tuple(_as_int(s, "shape", name) for s in shape)
    dtype = dtype_to_str(d.get("dtype"), name)
    ints = {k: _as_int(d.get(k), k, name) for k in ("offset", "nbytes", "start")}
    return TensorMeta(name=name, dtype=dtype, shape=dims, **ints)


def bucket_meta_from_dict(d: Mapping[str, Any]) -> BucketMeta:
    """Parse one bucket from its JSON form (validation is separate: `validate_bucket`)."""
    if not isinstance(d, Mapping) or not isinstance(d.get("tensors"), list):
        raise MetadataError(f"malformed bucket metadata: {str(d)[:200]}")
    tensors = tuple(tensor_meta_from_dict(t) for t in d["tensors"])
    ints = {k: _as_int(d.get(k), k, f"<bucket {d.get('index')}>") for k in ("index", "owner", "nbytes")}
    return BucketMeta(tensors=tensors, **ints)


# --------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class PieceSpec:
    """Planner input: elements [start, start + numel) of tensor `name`, filled by rank `owner`.

    `dtype` is the dtype in the buffer (after any cast); `numel=None` means the whole tensor.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    owner: int
    start: int = 0
    numel: int | None = None

    @property
    def piece_numel(self) -> int:
        return math.prod(self.shape) - self.start if self.numel is None else self.numel


class _Packer:
    """Greedy first-fit packer for one owner at a time; splits only what cannot fit a bucket."""

    def __init__(self, bucket_nbytes: int, align_nbytes: int) -> None:
        self.cap, self.align = bucket_nbytes, align_nbytes
        self.buckets: list[BucketMeta] = []
        self.cur: list[TensorMeta] = []
        self.end, self.owner = 0, -1

    def flush(self) -> None:
        if self.cur:
            self.buckets.append(BucketMeta(len(self.buckets), self.owner, self.end, tuple(self.cur)))
        self.cur, self.end = [], 0

    def _put(self, p: PieceSpec, offset: int, start: int, nbytes: int) -> None:
        self.cur.append(TensorMeta(p.name, p.dtype, p.shape, offset, nbytes, start))
        self.end = offset + nbytes

    def add(self, p: PieceSpec) -> None:
        if p.owner != self.owner:
            self.flush()
            self.owner = p.owner
        itemsize = itemsize_of(p.dtype, p.name)
        start, remaining = p.start, p.piece_numel
        if remaining == 0:
            if round_up(self.end, self.align) > self.cap:
                self.flush()
            self._put(p, round_up(self.end, self.align), start, 0)
        while remaining > 0:
            offset = round_up(self.end, self.align)
            room = max(0, (self.cap - offset) // itemsize)
            if room == 0 or (self.cur and room < remaining and remaining * itemsize <= self.cap):
                self.flush()  # a piece that fits a fresh bucket is never split
                continue
            take = min(room, remaining)
            self._put(p, offset, start, take * itemsize)
            start, remaining = start + take, remaining - take


def plan_buckets(pieces: Sequence[PieceSpec], bucket_nbytes: int, align_nbytes: int = 64) -> list[BucketMeta]:
    """Pack `pieces` into buckets of at most `bucket_nbytes` bytes; deterministic.

    Order: by owner rank, then input order. Offsets are multiples of `align_nbytes`; a piece that
    does not fit a whole bucket is split at element boundaries over consecutive buckets.
    """
    if align_nbytes < 16 or align_nbytes & (align_nbytes - 1):
        raise ValueError(f"align_nbytes must be a power of two >= 16, got {align_nbytes}")
    packer = _Packer(bucket_nbytes, align_nbytes)
    by_owner: dict[int, list[PieceSpec]] = {}
    for p in pieces:
        if itemsize_of(p.dtype, p.name) > bucket_nbytes:
            raise MetadataError(f"tensor {p.name!r}: bucket_nbytes={bucket_nbytes} is smaller than one element")
        by_owner.setdefault(p.owner, []).append(p)
    for owner in sorted(by_owner):
        for p in by_owner[owner]:
            packer.add(p)
        packer.flush()
    return packer.buckets


# --------------------------------------------------------------------------- validation


def _validate_piece(t: TensorMeta, bucket: BucketMeta, capacity_nbytes: int) -> None:
    """Raise MetadataError (naming the tensor) unless piece `t` is self-consistent and in bounds."""
    where = f"tensor {t.name!r} in bucket {bucket.index}"
    itemsize = itemsize_of(t.dtype, t.name)
    if any(s < 0 for s in t.shape):
        raise MetadataError(f"{where}: negative dimension in shape {t.shape}")
    if t.offset < 0 or t.nbytes < 0 or t.start < 0:
        raise MetadataError(f"{where}: negative offset/nbytes/start ({t.offset}, {t.nbytes}, {t.start})")
    if t.offset % itemsize or t.nbytes % itemsize:
        raise MetadataError(f"{where}: offset {t.offset} / nbytes {t.nbytes} not a multiple of itemsize {itemsize}")
    if t.start + t.nbytes // itemsize > t.full_numel:
        raise MetadataError(
            f"{where}: elements [{t.start}, {t.start + t.nbytes // itemsize}) exceed numel {t.full_numel} "
            f"of shape {t.shape}"
        )
    end = t.offset + t.nbytes
    if end > capacity_nbytes or end > bucket.nbytes:
        raise MetadataError(
            f"{where}: bytes [{t.offset}, {end}) overrun the bucket "
            f"({bucket.nbytes} B used, buffer {capacity_nbytes} B)"
        )


def validate_bucket(bucket: BucketMeta, capacity_nbytes: int) -> None:
    """Check every piece of `bucket` against a buffer of `capacity_nbytes`: bounds, alignment, overlaps."""
    prev_end, prev_name = 0, ""
    for t in sorted(bucket.tensors, key=lambda m: (m.offset, m.nbytes)):
        _validate_piece(t, bucket, capacity_nbytes)
        if t.offset < prev_end:
            raise MetadataError(
                f"tensor {t.name!r} in bucket {bucket.index}: offset {t.offset} overlaps tensor {prev_name!r} "
                f"ending at {prev_end}"
            )
        prev_end, prev_name = max(prev_end, t.offset + t.nbytes), t.name
    if not 0 <= bucket.nbytes <= capacity_nbytes:
        names = f"last tensor {prev_name!r}" if prev_name else "no tensors"
        raise MetadataError(
            f"bucket {bucket.index} ({names}): nbytes {bucket.nbytes} overruns the {capacity_nbytes}-byte buffer"
        )


def _check_coverage(name: str, pieces: list[TensorMeta]) -> None:
    """Pieces of one tensor must agree on dtype/shape and tile [0, numel) exactly once."""
    first = pieces[0]
    for p in pieces[1:]:
        if (p.dtype, p.shape) != (first.dtype, first.shape):
            raise MetadataError(
                f"tensor {name!r}: pieces disagree ({p.dtype}{list(p.shape)} vs {first.dtype}{list(first.shape)})"
            )
    nxt = 0
    for p in sorted(pieces, key=lambda m: m.start):
        if p.start != nxt:
            kind = "overlap" if p.start < nxt else "gap"
            raise MetadataError(f"tensor {name!r}: pieces {kind} at element {min(p.start, nxt)}")
        nxt = p.start + p.numel
    if nxt != first.full_numel:
        raise MetadataError(f"tensor {name!r}: pieces cover {nxt} of {first.full_numel} elements")


ExpectedSpec = Mapping[str, tuple[Sequence[int], "torch.dtype | str"]]


def _check_expected(by_name: Mapping[str, list[TensorMeta]], expected: ExpectedSpec) -> None:
    for name, pieces in by_name.items():
        if name not in expected:
            raise MetadataError(f"tensor {name!r} is not expected by the receiver")
        shape, dtype = expected[name]
        got = pieces[0]
        if tuple(shape) != got.shape:
            raise MetadataError(f"tensor {name!r}: shape {list(got.shape)} != expected {list(shape)}")
        if dtype_to_str(dtype, name) != got.dtype:
            raise MetadataError(f"tensor {name!r}: dtype {got.dtype} != expected {dtype_to_str(dtype, name)}")
    missing = [n for n in expected if n not in by_name]
    if missing:
        raise MetadataError(
            f"tensor {missing[0]!r} expected by the receiver is missing from the update ({len(missing)} missing)"
        )


def group_pieces(buckets: Iterable[BucketMeta]) -> dict[str, list[TensorMeta]]:
    """name -> its pieces, in bucket order."""
    by_name: dict[str, list[TensorMeta]] = {}
    for b in buckets:
        for t in b.tensors:
            by_name.setdefault(t.name, []).append(t)
    return by_name


def validate_plan(buckets: Sequence[BucketMeta], capacity_nbytes: int, expected: ExpectedSpec | None = None) -> None:
    """Validate a whole plan as received: indices, each bucket, per-tensor coverage, receiver expectations."""
    for i, b in enumerate(buckets):
        if b.index != i:
            raise MetadataError(f"bucket at position {i} has index {b.index}")
        validate_bucket(b, capacity_nbytes)
    by_name = group_pieces(buckets)
    for name, pieces in by_name.items():
        _check_coverage(name, pieces)
    if expected is not None:
        _check_expected(by_name, expected)
