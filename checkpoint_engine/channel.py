"""Control channel between a sender rank and its receiver: length-prefixed JSON over local TCP.

Only metadata travels here (bucket plans, checksums, acks, errors); tensor bytes go through the
IPC buffers. Every receive has a deadline: a silent peer raises `PeerTimeoutError`, a closed or
reset connection raises `PeerGoneError`; both messages name the peer and what was awaited.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from typing import Any

from k2post_checkpoint_engine.errors import CheckpointEngineError, PeerGoneError, PeerTimeoutError

_HEADER = struct.Struct("<Q")
MAX_MESSAGE_NBYTES = 1 << 30


class Channel:
    """A connected socket carrying dict messages; `peer` is used in every error message."""

    def __init__(self, sock: socket.socket, peer: str) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock: socket.socket | None = sock
        self.peer = peer

    def _live_sock(self, what: str) -> socket.socket:
        if self.sock is None:
            raise PeerGoneError(f"connection to {self.peer} is closed ({what})")
        return self.sock

    def send(self, msg: dict[str, Any]) -> None:
        data = json.dumps(msg, separators=(",", ":")).encode()
        sock = self._live_sock(f"sending {msg.get('t')!r}")
        try:
            sock.settimeout(None)
            sock.sendall(_HEADER.pack(len(data)) + data)
        except OSError as e:
            raise PeerGoneError(f"{self.peer} is gone: sending {msg.get('t')!r} failed ({e})") from None

    def _recv_exact(self, nbytes: int, deadline: float | None, what: str) -> bytes:
        sock, buf = self._live_sock(f"waiting for {what}"), bytearray()
        while len(buf) < nbytes:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise socket.timeout
            sock.settimeout(left)
            try:
                chunk = sock.recv(nbytes - len(buf))
            except (ConnectionResetError, BrokenPipeError) as e:
                raise PeerGoneError(f"{self.peer} reset the connection while we waited for {what} ({e})") from None
            if not chunk:
                raise PeerGoneError(f"{self.peer} closed the connection while we waited for {what}")
            buf += chunk
        return bytes(buf)

    def recv(self, timeout_s: float | None, what: str) -> dict[str, Any]:
        """Next message; `timeout_s=None` waits forever (a dead peer still raises PeerGoneError)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            (nbytes,) = _HEADER.unpack(self._recv_exact(_HEADER.size, deadline, what))
            if nbytes > MAX_MESSAGE_NBYTES:
                raise CheckpointEngineError(f"{self.peer} sent a {nbytes}-byte message while we waited for {what}")
            msg = json.loads(self._recv_exact(nbytes, deadline, what))
        except socket.timeout:
            raise PeerTimeoutError(
                f"no {what} from {self.peer} within {timeout_s:.1f} s (peer stuck or dead)"
            ) from None
        if not isinstance(msg, dict) or "t" not in msg:
            raise CheckpointEngineError(
                f"malformed message from {self.peer} while waiting for {what}: {str(msg)[:200]}"
            )
        return msg

    def recv_pending(self, timeout_s: float = 0.2) -> dict[str, Any] | None:
        """A message the peer sent before it went away (e.g. its error report), or None."""
        try:
            return self.recv(timeout_s, "a pending message")
        except CheckpointEngineError:
            return None

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket; port 0 picks a free one (read it from `getsockname()`)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(4)
    return sock


def accept(listener: socket.socket, timeout_s: float, what: str) -> tuple[socket.socket, str]:
    """Accept one connection within `timeout_s` or raise PeerTimeoutError naming `what`."""
    listener.settimeout(timeout_s)
    try:
        sock, addr = listener.accept()
    except socket.timeout:
        host, port = listener.getsockname()[:2]
        raise PeerTimeoutError(f"no {what} connected to {host}:{port} within {timeout_s:.1f} s") from None
    return sock, f"{addr[0]}:{addr[1]}"


def parse_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"checkpoint-engine address must look like 'host:port', got {address!r}")
    return host, int(port)


def connect(address: str, timeout_s: float) -> socket.socket:
    """Connect to a sender's `host:port`, retrying refused connections until `timeout_s`."""
    host, port = parse_address(address)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic()))
        except (ConnectionRefusedError, socket.timeout) as e:
            if time.monotonic() >= deadline:
                raise PeerTimeoutError(
                    f"could not connect to checkpoint-engine sender at {address} within {timeout_s:.1f} s ({e})"
                ) from None
            time.sleep(0.05)
