"""Attack: raw syscalls through ctypes that widen the kernel attack surface or bypass
socket filters: bpf, io_uring_setup, perf_event_open, keyctl, userfaultfd, setns,
clone with CLONE_NEWUSER|CLONE_NEWNET.

Expected containment: blocked -- the seccomp deny-list returns EPERM for each.
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
import platform

libc = ctypes.CDLL(None, use_errno=True)
NR = {
    "x86_64": {
        "bpf": 321,
        "io_uring_setup": 425,
        "perf_event_open": 298,
        "keyctl": 250,
        "userfaultfd": 323,
        "setns": 308,
        "clone": 56,
    },
    "aarch64": {
        "bpf": 280,
        "io_uring_setup": 425,
        "perf_event_open": 241,
        "keyctl": 219,
        "userfaultfd": 282,
        "setns": 268,
        "clone": 220,
    },
}[platform.machine()]
buf = ctypes.create_string_buffer(512)
ARGS = {
    "bpf": (0, buf, 64),
    "io_uring_setup": (8, buf),
    "perf_event_open": (buf, 0, -1, -1, 0),
    "keyctl": (0, 0),
    "userfaultfd": (0,),
    "setns": (0, 0),
    "clone": (0x10000000 | 0x40000000 | 17, 0, 0, 0, 0),
}


def syscall(name):
    ret = libc.syscall(NR[name], *ARGS[name])
    err = ctypes.get_errno()
    if ret == 0 and name == "clone":
        os._exit(0)  # the child of a successful clone
    if ret < 0:
        raise OSError(err, os.strerror(err))
    return f"{name} -> {ret}"


for name in NR:
    attempt(f"syscall {name}", lambda n=name: syscall(n))
