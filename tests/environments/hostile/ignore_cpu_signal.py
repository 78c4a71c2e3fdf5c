"""Attack: ignore SIGXCPU (and SIGTERM), then burn CPU forever.

Expected containment: killed -- the hard RLIMIT_CPU (cpu_s + 1) sends SIGKILL, which
cannot be ignored.
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


import signal

for sig in (signal.SIGXCPU, signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, signal.SIG_IGN)
x = 0
while True:
    x += 1
