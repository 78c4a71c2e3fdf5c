"""Attack: classic fork bomb -- every process forks forever.

Expected containment: timed out or killed -- RLIMIT_NPROC (per sandbox uid) caps the
process count, RLIMIT_CPU / the wall limit end the run, and the pid namespace teardown plus
the uid sweep leave no process behind.
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

while True:
    try:
        os.fork()
    except OSError:
        pass
