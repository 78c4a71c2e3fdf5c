"""Attack: plant symlinks in the work dir pointing outside (/etc/shadow, the host secret,
"../../../../.."), then read and write through them.

Expected containment: blocked -- links resolve inside the chroot, where the targets do not
exist or are read-only.
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
for name, target in (("l_shadow", "/etc/shadow"), ("l_secret", secret), ("l_up", "../../../../..")):
    os.symlink(target, name)
attempt("read via link to /etc/shadow", lambda: open("l_shadow").read()[:80])
attempt("read via link to host secret", lambda: open("l_secret").read()[:80])
attempt("read secret via ../ link", lambda: open("l_up" + secret).read()[:80])
attempt("write via ../ link", lambda: open("l_up/etc/pwned", "w").write("x"))
attempt("read secret via ../../ path", lambda: open("../../../../../.." + secret).read()[:80])
