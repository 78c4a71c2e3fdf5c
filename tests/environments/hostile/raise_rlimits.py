"""Attack: raise its own rlimits (CPU, address space, processes, file size, fds) to
unlimited, then loop.

Expected containment: blocked -- the hard limits were set by root before the uid drop, so
raising them fails with ValueError (EPERM); the CPU limit still ends the loop if any got through.
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


import resource

for name in ("RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_CORE"):
    which = getattr(resource, name)
    attempt(f"raise {name}", lambda w=which: resource.setrlimit(w, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)))
attempt("prlimit on pid 1", lambda: resource.prlimit(1, resource.RLIMIT_CPU, (1, 1)))
