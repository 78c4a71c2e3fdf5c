"""Attack: SIGKILL the parent, pid 1, a host process (CTX["canary_pid"]) and every pid up
to 4096 (then everything with kill(-1)).

Expected containment: blocked -- in the pid namespace host pids do not exist (ESRCH), the
root-owned init and launcher refuse (EPERM); only the program's own processes can die.
The test checks that the host canary process and the test process are alive.
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
import signal

me = os.getpid()
attempt("kill parent", lambda: os.kill(os.getppid(), signal.SIGKILL))
attempt("kill pid 1", lambda: os.kill(1, signal.SIGKILL))
attempt("kill host canary", lambda: os.kill(CTX.get("canary_pid", 999_999), signal.SIGKILL))
killed = []
for pid in range(1, 4096):
    if pid != me:
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except OSError:
            pass
print(f"BLOCKED pid sweep: signalled only {killed}" if not killed else f"ESCAPED pid sweep: {killed}")
try:
    os.kill(-1, signal.SIGKILL)  # spares the caller; must reach nothing outside
    print("BLOCKED kill(-1): only own processes are reachable")
except OSError as err:
    print(f"BLOCKED kill(-1): {err}")
