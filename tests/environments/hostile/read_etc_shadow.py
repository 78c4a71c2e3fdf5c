"""Attack: read the password hashes in /etc/shadow (and /etc/gshadow, /etc/sudoers).

Expected containment: blocked -- the chroot has no such files (ENOENT); without namespaces
the unprivileged sandbox uid gets EACCES.
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


for path in ("/etc/shadow", "/etc/gshadow", "/etc/sudoers"):
    attempt(f"read {path}", lambda p=path: open(p).read()[:80])
