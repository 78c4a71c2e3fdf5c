"""Attack: fork as many sleeping children as possible, then exit and leave them behind.

Expected containment: blocked -- fork fails with EAGAIN at RLIMIT_NPROC (at most
max_processes processes), and every orphan is killed when the run ends.
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


import os
import time

count = 0
try:
    while count < 10_000:
        if os.fork() == 0:
            time.sleep(120)
            os._exit(0)
        count += 1
    print(f"ESCAPED forked {count} children")
except OSError as err:
    print(f"BLOCKED fork after {count} children: {err}")
print(f"CHILDREN {count}", flush=True)
