"""Attack: hard-link host files (the secret, /etc/passwd, the python binary) into the work
dir to read or modify them from there.

Expected containment: blocked -- the work dir is its own tmpfs (EXDEV across mounts) and the
host secret is not visible.
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

for i, src in enumerate((CTX.get("canary_file", "/nonexistent"), "/etc/passwd", os.path.realpath(sys.executable))):
    attempt(f"hard link {src}", lambda s=src, n=i: os.link(s, f"link{n}") or open(f"link{n}", "rb").read(20))
