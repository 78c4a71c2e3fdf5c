"""Attack: read files outside the sandbox: a world-readable secret the host left in a temp
dir (CTX["canary_file"]), the project source, root's home, host config.

Expected containment: blocked -- none of these paths exist inside the chroot.
(Known gap without namespaces: world-readable files are readable by any uid.)
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

PATHS = [
    CTX.get("canary_file", "/nonexistent"),
    "/work/main/pyproject.toml",
    "/root/.bashrc",
    "/etc/hostname",
    "/etc/resolv.conf",
]
for path in PATHS:
    attempt(f"read {path}", lambda p=path: open(p).read()[:80])


def home_files():
    # ".pyenv" may be visible: the parent dirs of the interpreter's read-only bind, nothing else
    seen = [name for name in os.listdir("/root") if name != ".pyenv"]
    if seen:
        return seen
    raise PermissionError("no host home files visible in /root")


attempt("list /root", home_files)
attempt("list /home", lambda: os.listdir("/home"))
