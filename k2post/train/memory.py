"""Memory readings of the current process (trainer ranks, rollout actors, benchmarks): `rss_mib()` is the
resident memory now and `peak_rss_mib()` the peak so far, both in MiB."""

from __future__ import annotations

import os
import resource


def rss_mib() -> float:
    """Resident memory of this process now (MiB)."""
    with open("/proc/self/statm") as handle:
        pages = int(handle.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mib() -> float:
    """Peak resident memory of this process (MiB): VmHWM, the high-water mark of this program's memory. Not
    `ru_maxrss`, which survives exec: a child forked from a big parent (a test process holding a vLLM engine)
    reports the parent's size as its own peak."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
