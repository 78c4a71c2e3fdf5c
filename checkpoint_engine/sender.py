"""Sender side: runs in every trainer rank and streams the registered tensors to the receiver.

Per bucket k (same plan on every rank):
  1. the owner rank copies its pieces (casting dtype if configured) into the staging buffer:
     on CUDA a separate device buffer (the H2D copy), on CPU straight into IPC slot k % 2;
  2. it waits for the receiver's ack of bucket k-2 (the previous user of slot k % 2);
  3. the owner moves staging -> slot (CUDA only); it hashed each piece from its source while copying;
     `dist.broadcast` (group_src=owner) fills slot k % 2 on every rank (skipped when world_size=1);
  4. each rank with a receiver sends it the bucket's piece digests; the receiver checks them, loads the slot while
     the sender already fills and broadcasts bucket k+1 into the other slot.
The receiver connects to `sender.address`; the handshake shares the two IPC slots (shm names,
unlinked as soon as the receiver mapped them, or CUDA IPC handles). Every wait has `timeout_s`.
Run: see the example in `checkpoint_engine/__init__.py`; tests in tests/checkpoint_engine.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from k2post_checkpoint_engine.channel import Channel, accept, listen
from k2post_checkpoint_engine.checksum import piece_digest, source_piece
from k2post_checkpoint_engine.config import CheckpointEngineConfig
from k2post_checkpoint_engine.errors import CheckpointEngineError, PeerGoneError, ReceiverError
from k2post_checkpoint_engine.meta import BucketMeta, dtype_from_str, plan_buckets, round_up, validate_plan
from k2post_checkpoint_engine.shm import ShmSegment, sweep_stale_segments
from k2post_checkpoint_engine.sources import (
    MaterializedSources,
    Registration,
    Shard,
    make_registration,
    merge_registrations,
)

PROTOCOL_VERSION = 1
TRAILER_NBYTES = 64  # after the data: 8-byte checksum at round_up(bucket.nbytes, 8)

__all__ = ["PROTOCOL_VERSION", "PushStats", "Shard", "TRAILER_NBYTES", "WeightSender"]


@dataclass(frozen=True)
class PushStats:
    """One update as seen by one sender rank; `nbytes` is the whole update (all owners)."""

    nbytes: int
    n_buckets: int
    n_tensors: int
    elapsed_s: float
    ack_wait_s: float

    @property
    def gb_per_s(self) -> float:
        return self.nbytes / self.elapsed_s / 1e9 if self.elapsed_s > 0 else float("inf")


@dataclass(frozen=True)
class _CopyOp:
    """One piece this rank touches in a bucket; `copy=False`: collective materializer, no copy."""

    name: str
    offset: int
    nbytes: int
    dtype: torch.dtype
    local_start: int
    numel: int
    whole: bool
    copy: bool


class WeightSender:
    """Sender endpoint of one trainer rank. `push()` is collective over `group` when world_size > 1."""

    def __init__(
        self, config: CheckpointEngineConfig, rank: int = 0, world_size: int = 1,
        group: Any | None = None, *, serve: bool = True,
    ) -> None:  # fmt: skip
        self.config, self.rank, self.world_size, self.group = config, rank, world_size, group
        _check_group(rank, world_size, group)
        self.device = (
            torch.device("cuda", torch.cuda.current_device()) if config.device == "cuda" else torch.device("cpu")
        )
        self.buffer_nbytes = config.bucket_nbytes + TRAILER_NBYTES
        self._regs: dict[str, Registration] = {}
        self._plan: list[BucketMeta] | None = None
        self._plan_dicts: list[dict[str, Any]] = []
        self._plan_version, self._dirty = 0, True
        self._plan_nbytes = self._plan_n_tensors = 0
        self._ops: list[list[_CopyOp]] = []
        self._digests: dict[int, list[str]] = {}  # bucket index -> the owner's piece digests, until it is sent
        self._pieces_per_name: dict[str, int] = {}
        self._chan: Channel | None = None
        self._peer_plan_version = -1
        self._acked = 0
        self._shm: list[ShmSegment] = []
        self._slots: list[torch.Tensor] = []
        self._staging: torch.Tensor | None = None
        self._update = 0
        if config.device == "cpu":
            sweep_stale_segments(config.shm_prefix)
        self._listener = listen(config.host, config.port) if serve else None

    # ------------------------------------------------------------------ registration / plan

    @property
    def address(self) -> str | None:
        """`host:port` for `WeightReceiver`, or None when this rank serves no receiver."""
        if self._listener is None:
            return None
        host, port = self._listener.getsockname()[:2]
        return f"{host}:{port}"

    def register(
        self, name: str, source: torch.Tensor | Shard | Any, *, shape: Sequence[int] | None = None,
        dtype: torch.dtype | str | None = None, owner: int | None = None, collective: bool = False,
    ) -> None:  # fmt: skip
        """Register (or replace) the source of tensor `name`; see `k2post_checkpoint_engine.sources`."""
        reg = make_registration(name, source, shape, dtype, owner, collective, self.world_size)
        old = self._regs.get(name)
        self._regs[name] = reg
        if old is None or old.summary() != reg.summary():
            self._dirty = True

    def plan(self) -> list[BucketMeta]:
        """(Re)compute the bucket plan from every rank's registrations. Collective if world_size > 1."""
        summaries = [r.summary() for r in self._regs.values()]
        per_rank: list[Any] = [summaries]
        if self.world_size > 1:
            per_rank = [None] * self.world_size
            dist.all_gather_object(per_rank, summaries, group=self.group)
        plan = plan_buckets(
            merge_registrations(per_rank, self.config.dtype), self.config.bucket_nbytes, self.config.align_nbytes
        )
        validate_plan(plan, self.config.bucket_nbytes)
        self._plan, self._plan_dicts = plan, [b.to_dict() for b in plan]
        self._plan_nbytes = sum(b.payload_nbytes for b in plan)
        self._plan_n_tensors = len({t.name for b in plan for t in b.tensors})
        self._plan_version += 1
        self._ops = [self._ops_for(b) for b in plan]
        self._pieces_per_name = {}
        for ops in self._ops:
            for op in ops:
                self._pieces_per_name[op.name] = self._pieces_per_name.get(op.name, 0) + 1
        self._dirty = False
        return plan

    def _ops_for(self, bucket: BucketMeta) -> list[_CopyOp]:
        ops = []
        for t in bucket.tensors:
            reg = self._regs.get(t.name)
            owned = bucket.owner == self.rank
            if not owned and not (reg is not None and reg.collective):
                continue
            local_start = t.start - reg.start if reg.kind == "shard" else t.start
            whole = local_start == 0 and t.numel == reg.numel
            ops.append(
                _CopyOp(t.name, t.offset, t.nbytes, dtype_from_str(t.dtype, t.name), local_start, t.numel, whole, owned)
            )
        return ops

    def _ensure_plan(self) -> list[BucketMeta]:
        dirty = self._dirty or self._plan is None
        if self.world_size > 1:
            flag = torch.tensor([int(dirty)], device=_collective_device(self.group))
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
            dirty = bool(flag.item())
        return self.plan() if dirty else self._plan  # type: ignore[return-value]

    # ------------------------------------------------------------------ buffers / receiver

    def _ensure_slots(self) -> None:
        if not self._slots:
            self._slots = [torch.empty(self.buffer_nbytes, dtype=torch.uint8, device=self.device) for _ in range(2)]
        if self.device.type == "cuda" and self._staging is None:
            self._staging = torch.empty(self.buffer_nbytes, dtype=torch.uint8, device=self.device)

    def accept(self, timeout_s: float | None = None) -> None:
        """Wait for a receiver to connect and map the IPC buffers (replaces any previous one)."""
        if self._listener is None:
            raise CheckpointEngineError(f"rank {self.rank} was created with serve=False and takes no receiver")
        self._drop_receiver()
        timeout = self.config.timeout_s if timeout_s is None else timeout_s
        sock, addr = accept(self._listener, timeout, f"receiver for rank {self.rank}")
        chan = Channel(sock, f"receiver at {addr} (rank {self.rank})")
        try:
            hello = chan.recv(self.config.timeout_s, "receiver hello")
            if hello.get("t") != "hello" or hello.get("version") != PROTOCOL_VERSION:
                raise CheckpointEngineError(f"{chan.peer}: bad hello {hello!r} (protocol {PROTOCOL_VERSION})")
            chan.peer = f"receiver pid {hello.get('pid')} (rank {self.rank})"
            self._share_buffers(chan)
        except BaseException:
            chan.close()
            raise
        self._chan, self._peer_plan_version = chan, -1

    def _handshake(self, chan: Channel, buffers: dict[str, Any]) -> None:
        info = {"capacity_nbytes": self.config.bucket_nbytes, "buffer_nbytes": self.buffer_nbytes, "rank": self.rank}
        chan.send({"t": "buffers", **info, **buffers})
        reply = chan.recv(self.config.timeout_s, "attach confirmation")
        if reply.get("t") == "error":
            raise ReceiverError(f"{chan.peer} could not attach the IPC buffers: {reply.get('message')}")

    def _share_buffers(self, chan: Channel) -> None:
        if self.device.type == "cuda":
            from k2post_checkpoint_engine.cuda_ipc import export_cuda_buffer

            self._ensure_slots()
            self._handshake(chan, {"kind": "cuda_ipc", "handles": [export_cuda_buffer(s) for s in self._slots]})
            return
        segs = [ShmSegment.create(self.config.shm_prefix, self.buffer_nbytes) for _ in range(2)]
        try:
            self._handshake(chan, {"kind": "shm", "names": [s.name for s in segs]})
        except BaseException:
            for s in segs:
                s.close()
            raise
        finally:
            for s in segs:
                s.unlink()  # mapped on both sides now (or failed): the name is no longer needed
        self._close_shm()
        self._shm, self._slots = segs, [s.tensor for s in segs]  # type: ignore[misc]

    def _ensure_receiver(self) -> Channel | None:
        if self._listener is None:
            return None
        if self._chan is None:
            self.accept()
        return self._chan

    def _drop_receiver(self) -> None:
        if self._chan is not None:
            self._chan.close()
            self._chan = None

    def _close_shm(self) -> None:
        self._slots = []
        for s in self._shm:
            s.close()
        self._shm = []

    # ------------------------------------------------------------------ push

    def push(self) -> PushStats:
        """Stream every registered tensor to the receiver once; returns when all buckets are acked."""
        t0 = time.perf_counter()
        plan = self._ensure_plan()
        chan = self._ensure_receiver()
        self._ensure_slots()
        try:
            ack_wait_s = self._stream(plan, chan)
        except BaseException as e:
            self._abort(chan, e)
            raise
        elapsed_s = time.perf_counter() - t0
        return PushStats(self._plan_nbytes, len(plan), self._plan_n_tensors, elapsed_s, ack_wait_s)

    def _stream(self, plan: list[BucketMeta], chan: Channel | None) -> float:
        self._update += 1
        self._acked, wait_s = 0, 0.0
        if chan is not None:
            self._send_begin(chan, len(plan))
        sources = MaterializedSources(self._regs, self._pieces_per_name)
        try:
            for b in plan:
                if self._staging is not None:
                    self._copy_pieces(b, self._staging, sources)
                if chan is not None and b.index >= 2:
                    wait_s += self._wait_acks(chan, b.index - 1)
                digests = self._fill_and_broadcast(b, sources)
                if chan is not None:
                    self._send(chan, {"t": "bucket", "i": b.index, "digests": digests})
        finally:
            sources.close_all()
        if chan is not None:
            self._send(chan, {"t": "end", "update": self._update, "n_buckets": len(plan)})
            wait_s += self._wait_acks(chan, len(plan))
            self._expect(chan, "done", "end-of-update confirmation")
        return wait_s

    def _send_begin(self, chan: Channel, n_buckets: int) -> None:
        msg: dict[str, Any] = {"t": "begin", "update": self._update, "n_buckets": n_buckets,
                               "plan_version": self._plan_version, "checksum": self.config.verify_checksum}  # fmt: skip
        if self._peer_plan_version != self._plan_version:
            msg["plan"] = self._plan_dicts
            self._peer_plan_version = self._plan_version
        self._send(chan, msg)

    def _copy_pieces(self, bucket: BucketMeta, dst: torch.Tensor, sources: MaterializedSources) -> None:
        """Copy (and cast) this rank's pieces of `bucket` into `dst`; touch collective materializers. With
        `verify_checksum`, the owner also hashes each piece from its source (`self._digests[bucket.index]`)."""
        digests = []
        for op in self._ops[bucket.index]:
            src = sources.get(op.name)
            if self.config.verify_checksum and op.copy:
                digests.append(piece_digest(source_piece(src, op.local_start, op.numel, op.dtype)))
            if op.copy and op.numel:
                out = dst[op.offset : op.offset + op.nbytes].view(op.dtype)
                if op.whole:
                    out.view(src.shape).copy_(src, non_blocking=True)
                else:
                    out.copy_(src.reshape(-1)[op.local_start : op.local_start + op.numel], non_blocking=True)
            sources.done(op.name)
        self._digests[bucket.index] = digests

    def _fill_and_broadcast(self, bucket: BucketMeta, sources: MaterializedSources) -> list[str] | None:
        """Fill slot index % 2 on the owner and broadcast it; returns the owner's piece digests (or None)."""
        slot = self._slots[bucket.buffer_slot]
        data_nbytes = round_up(bucket.nbytes, 8)
        owner = bucket.owner == self.rank
        if self._staging is None:
            self._copy_pieces(bucket, slot, sources)
        elif owner:
            slot[:data_nbytes].copy_(self._staging[:data_nbytes])
        if self.world_size > 1:
            dist.broadcast(slot[:data_nbytes], group=self.group, group_src=bucket.owner)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        if not self.config.verify_checksum:
            return None
        digests = [self._digests.pop(bucket.index, None) if owner else None]
        if self.world_size > 1:  # every rank with a receiver sends it the owner's digests
            dist.broadcast_object_list(digests, group=self.group, group_src=bucket.owner)
        return digests[0]

    def _send(self, chan: Channel, msg: dict[str, Any]) -> None:
        """Send; if the receiver is gone, surface the error it reported before leaving (if any)."""
        try:
            chan.send(msg)
        except PeerGoneError as e:
            last = chan.recv_pending()
            while last is not None and last.get("t") == "ack":
                last = chan.recv_pending()
            if last is not None and last.get("t") == "error":
                raise ReceiverError(f"{chan.peer} failed during update {self._update}: {last.get('message')}") from e
            raise

    def _wait_acks(self, chan: Channel, n_acked: int) -> float:
        """Block until the receiver has acked buckets [0, n_acked); returns seconds spent waiting."""
        t0 = time.perf_counter()
        while self._acked < n_acked:
            msg = self._expect(chan, "ack", f"ack of bucket {self._acked}")
            if msg.get("i") != self._acked:
                raise CheckpointEngineError(f"{chan.peer}: ack for bucket {msg.get('i')}, expected {self._acked}")
            self._acked += 1
        return time.perf_counter() - t0

    def _expect(self, chan: Channel, kind: str, what: str) -> dict[str, Any]:
        msg = chan.recv(self.config.timeout_s, what)
        if msg["t"] == "error":
            raise ReceiverError(f"{chan.peer} failed during update {self._update}: {msg.get('message')}")
        if msg["t"] != kind:
            raise CheckpointEngineError(f"{chan.peer}: got {msg['t']!r} while waiting for {what}")
        return msg

    def _abort(self, chan: Channel | None, exc: BaseException) -> None:
        """Best-effort notice to the receiver, then drop it; the next push accepts a new one."""
        if chan is not None and not isinstance(exc, PeerGoneError):
            try:
                chan.send({"t": "error", "message": f"sender rank {self.rank} aborted update {self._update}: {exc}"})
            except CheckpointEngineError:
                pass
        self._drop_receiver()

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Tell the receiver we are done, close sockets, unlink and unmap every shm segment."""
        if self._chan is not None:
            try:
                self._chan.send({"t": "bye"})
            except CheckpointEngineError:
                pass
        self._drop_receiver()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        self._close_shm()
        self._staging = None

    def __enter__(self) -> WeightSender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _collective_device(group: Any | None) -> torch.device:
    backend = dist.get_backend(group)
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")


def _check_group(rank: int, world_size: int, group: Any | None) -> None:
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, {world_size})")
    if world_size == 1:
        return
    if not dist.is_available() or not dist.is_initialized():
        raise CheckpointEngineError("world_size > 1 needs torch.distributed initialized (gloo on CPU, nccl on GPU)")
    got = (dist.get_rank(group), dist.get_world_size(group))
    if got != (rank, world_size):
        raise CheckpointEngineError(f"rank/world_size {(rank, world_size)} disagree with the process group's {got}")
