"""Attack: look for secrets in environment variables: os.environ, /proc/self/environ,
/proc/1/environ, /proc/<ppid>/environ (the test puts CTX["secret_name"] in its own env).

Expected containment: blocked -- the program starts with a minimal environment (PATH,
HOME, TMPDIR, LANG) and the other processes' environ files are unreadable (EACCES).
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

name, secret = CTX.get("secret_name", "K2_SECRET"), CTX.get("secret_value", "")
print("ENV KEYS", json.dumps(sorted(os.environ)))


def look(text):
    if name in text or (secret and secret in text):
        return "secret found"
    raise LookupError("no secret")


attempt("os.environ", lambda: look(repr(dict(os.environ))))
for pid in ("self", "1", str(os.getppid())):
    attempt(f"/proc/{pid}/environ", lambda p=pid: look(open(f"/proc/{p}/environ").read()))
