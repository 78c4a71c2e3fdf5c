"""Attack: open a TCP connection to a listener on the host loopback (127.0.0.1:CTX["tcp_port"]).

Expected containment: blocked -- ENETUNREACH in the empty network namespace (lo is down),
EACCES from the seccomp socket filter in "blocked" mode; the host listener sees no connection.
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
    with socket.create_connection(("127.0.0.1", CTX["tcp_port"]), timeout=2) as sock:
        sock.sendall(b"pwned")
        return "connected"


attempt("tcp connect", connect)
