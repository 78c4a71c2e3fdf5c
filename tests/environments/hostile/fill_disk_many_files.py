"""Attack: fill the disk with many files, each below the per-file limit (up to 2 GiB).

Expected containment: blocked -- the sandbox tmpfs is full at max_disk_mb (ENOSPC); the
host disk is untouched.
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


block = b"\1" * (1 << 20)


def fill():
    for i in range(256):
        with open(f"part{i}.bin", "wb") as fh:
            for _ in range(8):
                fh.write(block)
    return "wrote 2 GiB"


attempt("write 256 x 8 MiB", fill)
