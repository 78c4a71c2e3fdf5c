"""Attack: regain root through libc via ctypes: setuid(0), setgid(0), a user namespace with
unshare, mount a filesystem, the mkdir/chroot/chdir("..") chroot escape, ptrace pid 1.

Expected containment: blocked -- no capabilities after the uid drop (EPERM), and seccomp
denies unshare/mount/chroot/ptrace outright.
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


import ctypes
import os

libc = ctypes.CDLL(None, use_errno=True)


def call(name, *args):
    ret = getattr(libc, name)(*args)
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return f"{name} returned 0; uid now {os.getuid()}"


attempt("setuid(0)", lambda: call("setuid", 0))
attempt("setgid(0)", lambda: call("setgid", 0))
attempt("unshare(CLONE_NEWUSER)", lambda: call("unshare", 0x10000000))
attempt("unshare(CLONE_NEWNS)", lambda: call("unshare", 0x00020000))
attempt("mount tmpfs", lambda: call("mount", b"tmpfs", b"/sandbox", b"tmpfs", 0, None))
attempt("chroot escape", lambda: os.mkdir("jail") or call("chroot", b"jail"))
attempt("ptrace attach pid 1", lambda: call("ptrace", 16, 1, None, None))
