"""Attack: sleep (no CPU use, so RLIMIT_CPU never fires) past every limit.

Expected containment: timed out -- the parent kills the process group at wall_s.
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


import time

time.sleep(3600)
