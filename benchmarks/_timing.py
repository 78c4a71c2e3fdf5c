"""Shared timing helper for the benchmark scripts (run them from the repo root)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wall_times(fn: Callable[[], object], repeats: int, warmup: int = 1) -> list[float]:
    """Wall seconds of `repeats` calls of `fn`, after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times
