"""Attack: exhaust inodes with a flood of empty files and directories.

Expected containment: blocked -- the tmpfs nr_inodes cap gives ENOSPC; the host
filesystem's inodes are untouched.
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


def flood():
    for i in range(200_000):
        if i % 2:
            open(f"f{i}", "w").close()
        else:
            os.mkdir(f"d{i}")
    return "created 200k inodes"


attempt("create 200k inodes", flood)
