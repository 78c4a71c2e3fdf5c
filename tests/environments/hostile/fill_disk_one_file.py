"""Attack: fill the disk with one huge file (up to 2 GiB).

Expected containment: blocked -- RLIMIT_FSIZE stops the file at max_file_mb (EFBIG; SIGXFSZ
is ignored by Python) and it lives on the size-capped tmpfs, never on the host disk.
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


block = b"\0" * (1 << 20)


def fill():
    with open("big.bin", "wb") as fh:
        for _ in range(2048):
            fh.write(block)
            fh.flush()
    return "wrote 2 GiB"


attempt("write 2 GiB", fill)
