"""Attack: send UDP datagrams to a host loopback port (127.0.0.1:CTX["udp_port"]).

Expected containment: blocked -- sendto fails (no route in the network namespace / socket
denied by seccomp) and the host socket receives nothing.
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


def send():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        return sock.sendto(b"pwned", ("127.0.0.1", CTX["udp_port"]))


attempt("udp sendto", send)
