"""Attack: reach the host filesystem through /proc: /proc/1/root, /proc/<ppid>/root and
/proc/<ppid>/cwd, then read the secret and /etc/shadow through them.

Expected containment: blocked -- /proc only shows the sandbox pid namespace, and the
root-owned init's /proc entries are not accessible to the sandbox uid (EACCES).
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

secret = CTX.get("canary_file", "/nonexistent")
for pid in ("1", str(os.getppid())):
    attempt(f"read via /proc/{pid}/root", lambda p=pid: open(f"/proc/{p}/root{secret}").read()[:80])
    attempt(f"shadow via /proc/{pid}/root", lambda p=pid: open(f"/proc/{p}/root/etc/shadow").read()[:80])
    attempt(f"list /proc/{pid}/cwd", lambda p=pid: os.listdir(f"/proc/{p}/cwd"))
