"""Attack: fill /dev/shm (RAM-backed on the host) and /tmp with files.

Expected containment: blocked -- /dev/shm and /tmp are binds of the sandbox tmpfs, capped at
max_disk_mb (ENOSPC); the host /dev/shm stays unchanged.
"""

import json
import sys

CTX = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}


def attempt(what, fn):
    """Run one attack step: an exception means it was blocked, a return value means it escaped."""
    try:
        got = fn()
    except BaseException as err:  # noqa: BLE001
        print(f"BLOCKED {what}: {type(err).__name__}: {err}"[:300], flush=True)
        return None
    print(f"ESCAPED {what}: {got!r}"[:300], flush=True)
    return got


block = b"\2" * (1 << 20)


def fill(path):
    for i in range(1024):
        with open(f"{path}/k2post-hostile-{i}", "wb") as fh:
            fh.write(block * 4)
    return f"wrote 4 GiB to {path}"


attempt("fill /dev/shm", lambda: fill("/dev/shm"))
attempt("fill /tmp", lambda: fill("/tmp"))
