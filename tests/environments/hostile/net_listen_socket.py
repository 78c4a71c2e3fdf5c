"""Attack: open a listening TCP socket on 127.0.0.1:CTX["listen_port"] and wait for clients.

Expected containment: blocked -- inside the network namespace the bind works but the socket
is unreachable from the host (the test keeps trying to connect); with seccomp the socket
call itself fails. A client that gets through prints ESCAPED.
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


def listen():
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", CTX["listen_port"]))
    srv.listen(4)
    srv.settimeout(1.5)
    print("LISTENING", flush=True)
    conn, addr = srv.accept()
    return f"client {addr} got in"


attempt("listen (an accept timeout means no client reached it)", listen)
