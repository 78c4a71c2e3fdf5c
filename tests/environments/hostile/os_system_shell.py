"""Attack: shell out with os.system / subprocess: id, read /etc/shadow, list /root and
/work, reach the network with bash's /dev/tcp.

Expected containment: blocked -- the shell runs with the same uid, chroot, namespaces and
seccomp; every command fails. Shell output that shows a success prints ESCAPED.
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
import subprocess


def sh(cmd):
    out = subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, text=True, timeout=5)
    if out.returncode != 0:
        raise OSError(f"exit {out.returncode}: {out.stderr.strip()[:100]}")
    return out.stdout[:100]


print("id:", subprocess.run(["id"], capture_output=True, text=True).stdout.strip())
attempt("sh: cat /etc/shadow", lambda: sh("cat /etc/shadow"))
attempt("sh: ls /root /work", lambda: sh("ls /root /work"))
attempt("sh: bash /dev/tcp", lambda: sh(f"bash -c 'echo pwned > /dev/tcp/127.0.0.1/{CTX.get('tcp_port', 1)}'"))


def system_write():
    status = os.system("echo x > /etc/pwned 2>/dev/null")
    if status != 0:
        raise OSError(f"os.system exit status {status}")
    return "wrote /etc/pwned"


attempt("os.system: write /etc", system_write)
attempt("sh: id -u is 0", lambda: sh("test $(id -u) -eq 0 && echo root"))
