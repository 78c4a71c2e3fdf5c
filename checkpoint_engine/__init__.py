"""checkpoint_engine: streaming, bucketed weight broadcast from trainer ranks to an inference engine.

No disk: every update streams the trainer's named tensors through a staging copy, a
torch.distributed broadcast and two alternating IPC buffers (POSIX shm on CPU, CUDA IPC on GPU)
that the inference process maps and reads zero-copy. Self-contained (does not import k2post).
Design and guarantees: docs/CHECKPOINT_ENGINE.md. Tests: `python -m pytest tests/checkpoint_engine -q`.
Import note: an editable install made before this package existed maps `checkpoint_engine` to a
namespace package (no names importable); fix with `pip install -e . --no-deps` or PYTHONPATH=<repo root>.

Public API
----------
CheckpointEngineConfig(bucket_nbytes=256 MiB, align_nbytes=64, timeout_s=60.0, verify_checksum=True,
                       dtype: str | None = None, device: "cpu" | "cuda" = "cpu",
                       host="127.0.0.1", port=0, shm_prefix="k2ce")      # pydantic v2, extra="forbid"

WeightSender(config, rank: int = 0, world_size: int = 1, group: ProcessGroup | None = None, *, serve: bool = True)
    .address -> str | None            "host:port" a receiver connects to (None when serve=False)
    .register(name, source, *, shape=None, dtype=None, owner: int | None = None, collective: bool = False)
        source: torch.Tensor (full tensor held by this rank; live, re-read on every push)
              | Shard(local: Tensor, full_shape: Sequence[int], start: int)   (flat element range
                [start, start + local.numel()) of the full tensor, the way ZeRO partitions it)
              | Callable[[], Tensor | ContextManager[Tensor]]   (materializer, e.g. a ZeRO-3 gather
                context; needs shape= and dtype=; collective=True: every rank registers and calls it)
    .plan() -> list[BucketMeta]       deterministic, same on every rank (collective if world_size > 1)
    .accept(timeout_s: float | None = None) -> None   wait for the receiver (push() does it lazily)
    .push() -> PushStats              one full update (collective if world_size > 1)
    .close() / context manager        unlinks every shm segment, closes sockets
WeightReceiver(address: str, load: Callable[[list[tuple[str, Tensor]]], None], *, timeout_s: float = 60.0,
               verify_checksum: bool = True,
               expected: Mapping[str, tuple[Sequence[int], torch.dtype | str]] | None = None,
               device_index: int | None = None)
    .connect() -> None                handshake + attach the two IPC buffers (run_update does it lazily)
    .run_update(wait_s: float | None = None) -> UpdateStats   receive one update; wait_s bounds the wait
                                      for it to start (None: timeout_s); call it while the sender pushes
    .serve(n_updates: int | None = None, idle_timeout_s: float | None = None) -> list[UpdateStats]
                                      loop; n_updates=None: until the sender closes (sender.close())
    .close() / context manager
PushStats(nbytes, n_buckets, n_tensors, elapsed_s, ack_wait_s; .gb_per_s)
UpdateStats(nbytes, n_buckets, n_tensors, elapsed_s, load_s, verify_s; .gb_per_s)
Errors (all subclass CheckpointEngineError(RuntimeError)): MetadataError (also ValueError), PeerGoneError
(also ConnectionError), PeerTimeoutError (also TimeoutError), ReceiverError (sender side: the receiver
reported a failure), IntegrityError (receiver side: a piece digest mismatch, naming the tensor).
Bad register() args: ValueError/TypeError.
sweep_stale_segments(prefix="k2ce") -> list[str]   unlink /dev/shm segments whose creator pid is dead.

`load` gets zero-copy views of the IPC buffer (tensors split across buckets or ranks arrive reassembled):
copy them before returning; the sender reuses the buffer only after `load` returned (ack).

Usage (1 sender process, 1 receiver process; pass the address any way you like)
-------------------------------------------------------------------------------
    # sender process                                  # receiver process
    import torch                                      import torch
    from k2post_checkpoint_engine import (                   from k2post_checkpoint_engine import WeightReceiver
        CheckpointEngineConfig, WeightSender)         params: dict[str, torch.Tensor] = ...
    cfg = CheckpointEngineConfig(                     def load(batch):  # list[(name, tensor view)]
        bucket_nbytes=64 << 20, verify_checksum=False)    for name, t in batch:
    weights = {"w": torch.randn(4096, 4096)}                  params[name].copy_(t)
    with WeightSender(cfg) as sender:                 rx = WeightReceiver(address, load, timeout_s=30)
        for name, t in weights.items():               with rx:
            sender.register(name, t)                      for _ in range(3):
        send_to_receiver(sender.address)                      stats = rx.run_update()
        for _ in range(3):
            stats = sender.push()   # blocks until the receiver acked every bucket
            print(stats.gb_per_s)
"""

from k2post_checkpoint_engine.config import CheckpointEngineConfig
from k2post_checkpoint_engine.errors import (
    CheckpointEngineError,
    IntegrityError,
    MetadataError,
    PeerGoneError,
    PeerTimeoutError,
    ReceiverError,
)
from k2post_checkpoint_engine.meta import BucketMeta, TensorMeta, plan_buckets
from k2post_checkpoint_engine.receiver import UpdateStats, WeightReceiver
from k2post_checkpoint_engine.sender import PushStats, Shard, WeightSender
from k2post_checkpoint_engine.shm import sweep_stale_segments

__all__ = [
    "BucketMeta",
    "CheckpointEngineConfig",
    "CheckpointEngineError",
    "IntegrityError",
    "MetadataError",
    "PeerGoneError",
    "PeerTimeoutError",
    "PushStats",
    "ReceiverError",
    "Shard",
    "TensorMeta",
    "UpdateStats",
    "WeightReceiver",
    "WeightSender",
    "plan_buckets",
    "sweep_stale_segments",
]
