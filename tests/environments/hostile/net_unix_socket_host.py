"""Attack: connect to a Unix socket a host service listens on (CTX["unix_path"]).

Expected containment: blocked -- the host path does not exist inside the chroot (ENOENT);
without namespaces the uid drop and the socket file mode decide.
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


import socket


def connect():
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        sock.connect(CTX["unix_path"])
        sock.sendall(b"pwned")
        return "connected"


attempt("unix connect", connect)
