"""Attack: connect to a host abstract Unix socket ("\\0" + CTX["abstract_name"]).

Abstract sockets have no file permissions; they are scoped by the network namespace.
Expected containment: blocked -- ECONNREFUSED inside a fresh network namespace. (Known gap
in the "blocked" fallback without a network namespace: AF_UNIX is allowed, so it connects.)
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
        sock.connect("\0" + CTX["abstract_name"])
        sock.sendall(b"pwned")
        return "connected"


attempt("abstract unix connect", connect)
