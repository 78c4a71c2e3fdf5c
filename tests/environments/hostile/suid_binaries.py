"""Attack: run set-user-ID binaries (su, mount, passwd, chsh, newgrp) hoping for euid 0, and
make a set-uid copy of the shell in the work dir.

Expected containment: blocked -- system dirs are bound nosuid, no_new_privs is set (for
seccomp), so set-uid bits are ignored; the copies cannot get root.
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
import shutil
import stat
import subprocess


def run_suid(path):
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    out = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=5)
    probe = subprocess.run(["/bin/sh", "-c", "id -u"], capture_output=True, text=True).stdout.strip()
    if probe == "0":
        return f"{path}: euid 0"
    raise PermissionError(f"{path} exit {out.returncode}, still uid {probe}")


for path in ("/usr/bin/su", "/usr/bin/mount", "/usr/bin/passwd", "/usr/bin/chsh", "/usr/bin/newgrp"):
    attempt(f"run {path}", lambda p=path: run_suid(p))


def suid_copy():
    shutil.copy("/bin/sh", "mysh")
    os.chmod("mysh", stat.S_ISUID | 0o755)
    uid = subprocess.run(["./mysh", "-p", "-c", "id -u"], capture_output=True, text=True).stdout.strip()
    if uid == "0":
        return "suid copy gave root"
    raise PermissionError(f"suid copy still uid {uid}")


attempt("set-uid copy of sh", suid_copy)
