"""Attack: change kernel and host state through /proc and sethostname: /proc/sys/kernel/*,
/proc/sysrq-trigger, /proc/sys/vm/drop_caches, the hostname.

Expected containment: blocked -- /proc is mounted read-only and the sandbox uid has no
capabilities (EROFS / EACCES / EPERM); the UTS namespace would keep a hostname change local.
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


import socket

for path, value in (
    ("/proc/sys/kernel/hostname", "pwned"),
    ("/proc/sysrq-trigger", "b"),
    ("/proc/sys/vm/drop_caches", "3"),
    ("/proc/sys/kernel/core_pattern", "|/tmp/x"),
):
    attempt(f"write {path}", lambda p=path, v=value: open(p, "w").write(v))
attempt("sethostname", lambda: socket.sethostname("pwned"))
