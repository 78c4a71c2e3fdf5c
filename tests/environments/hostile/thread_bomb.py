"""Attack: start threads until the machine runs out.

Expected containment: blocked -- threads count against RLIMIT_NPROC of the sandbox uid
(and RLIMIT_AS bounds their stacks): "can't start new thread".
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


import threading
import time

threads = []


def bomb():
    for _ in range(100_000):
        t = threading.Thread(target=time.sleep, args=(60,), daemon=True)
        t.start()
        threads.append(t)
    return "started 100k threads"


attempt("start threads", bomb)
print(f"THREADS {len(threads)}", flush=True)
