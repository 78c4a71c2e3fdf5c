"""Attack: exhaust file descriptors (and kernel memory) by opening files and pipes forever.

Expected containment: blocked -- RLIMIT_NOFILE gives EMFILE after max_open_files.
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

held = []


def exhaust():
    for _ in range(1_000_000):
        held.extend(os.pipe())
    return "opened 2M fds"


attempt("open pipes", exhaust)
print(f"HELD {len(held)}")
