"""Attack: write files outside the work dir: into a world-writable host dir
(CTX["canary_dir"]), /etc, /usr, /, the interpreter's prefix, and /var/tmp.

Expected containment: blocked -- the chroot root and system binds are read-only (EROFS) and
the host dir does not exist inside. The test checks that nothing appeared on the host.
(Known gap without namespaces: world-writable host dirs are writable.)
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
import sys

TARGETS = [
    os.path.join(CTX.get("canary_dir", "/nonexistent"), "pwned"),
    "/etc/pwned",
    "/usr/pwned",
    "/pwned",
    os.path.join(sys.prefix, "pwned"),
    "/var/tmp/pwned",
]
for path in TARGETS:
    attempt(f"write {path}", lambda p=path: open(p, "w").write("pwned"))
