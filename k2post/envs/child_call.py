"""Run a scorer's risky call in a child process with a hard wall-clock timeout.

Some work cannot be interrupted from inside the process that runs it: one C-level big-integer operation in sympy
(`(9999^9999)^9999`) ignores SIGALRM until it finishes, minutes later. A scorer that must call such code on
untrusted input hands the call to a `ChildCall`: a persistent child (`python -m k2post.envs.child_call TARGET`,
started with `subprocess.Popen` in its own session, so safe from threaded callers) imports `module:function`
once and answers one JSON call per line. A call past its time kills the child's whole process group and raises
`ChildTimeout` (the input's fault: the caller scores it as a failed response); a new child is started at once so
the next call only waits for its import. A child that cannot start, dies or answers garbage raises `ChildFailure`
(the machine's fault: the caller lets it surface as a scoring error).

    verify = shared_child("k2post.envs.math_equal:verify_equal", warmup=["\\\\binom{4}{2}", "6"])
    verify.call("\\\\frac{1}{2}", "0.5", timeout_s=2.0)        # True; ChildTimeout after 2 s of wall time

The child has an address-space limit (`memory_mb`) and dies with its parent (PR_SET_PDEATHSIG where Linux has it).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib
import json
import os
import resource
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, Any

START_TIMEOUT_S = 120.0
"""Seconds a child may take to import its target (sympy and friends: a few seconds on a busy machine)."""
MEMORY_MB = 4096
"""Default address-space limit of a child, in MiB."""
TAIL_CHARS = 300


class ChildTimeout(Exception):
    """The call ran past its time; the child was killed (the input's fault)."""


class ChildFailure(RuntimeError):
    """The child could not start, died, or answered something unreadable (an infrastructure fault)."""


class ChildCall:
    """A persistent child process that runs `module:function` on JSON arguments, one call at a time."""

    def __init__(
        self,
        target: str,
        warmup: list[Any] | None = None,
        memory_mb: int = MEMORY_MB,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        self.target = target
        self.warmup = list(warmup or [])
        self.memory_mb = memory_mb
        self.start_timeout_s = start_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._ready = False
        self._buffer = b""
        self._lock = threading.Lock()
        self.kills = 0

    def call(self, *args: Any, timeout_s: float) -> Any:
        """`function(*args)` in the child; ChildTimeout after `timeout_s` seconds, ChildFailure if it breaks."""
        with self._lock:
            self._ensure_ready()
            assert self._proc is not None and self._proc.stdin is not None
            try:
                self._proc.stdin.write(json.dumps(list(args)).encode() + b"\n")
                self._proc.stdin.flush()
            except OSError as err:
                self._stop()
                raise ChildFailure(f"{self.target}: child closed its input ({err})") from None
            line = self._read_line(time.monotonic() + timeout_s)
            if line is None:
                self._restart()
                raise ChildTimeout(f"{self.target}: no answer in {timeout_s:g} s (child killed)")
            return self._result(line)

    def close(self) -> None:
        """Kill the child (a later call starts a new one)."""
        with self._lock:
            self._stop()

    # ------------------------------------------------------------ child lifecycle

    def _start(self) -> None:
        self._stderr = tempfile.TemporaryFile()
        warmup = json.dumps(self.warmup)
        command = [sys.executable, "-m", "k2post.envs.child_call", self.target, str(self.memory_mb), warmup]
        self._proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, start_new_session=True
        )
        self._ready, self._buffer = False, b""

    def _ensure_ready(self) -> None:
        """Start the child if there is none (or it died), then wait for its `ready` line."""
        if self._proc is None or self._proc.poll() is not None:
            self._stop()
            self._start()
        if self._ready:
            return
        line = self._read_line(time.monotonic() + self.start_timeout_s)
        if line != b'"ready"':
            why = "did not start in time" if line is None else f"said {line[:80]!r}"
            tail = self._stderr_tail()
            self._stop()
            raise ChildFailure(f"{self.target}: child {why}{': ' + tail if tail else ''}")
        self._ready = True

    def _restart(self) -> None:
        """Kill a child stuck in a call and start the next one now (it imports while the caller goes on)."""
        self.kills += 1
        self._stop()
        self._start()

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            for stream in (proc.stdin, proc.stdout):
                with contextlib.suppress(OSError):
                    stream and stream.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        self._ready, self._buffer = False, b""

    # ------------------------------------------------------------ reading

    def _read_line(self, deadline: float) -> bytes | None:
        """One line from the child before `deadline` (None: none came); ChildFailure when the child has died."""
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            readable, _, _ = select.select([fd], [], [], remaining)
            if not readable:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                tail = self._stderr_tail()
                self._stop()
                raise ChildFailure(f"{self.target}: child died{': ' + tail if tail else ''}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def _result(self, line: bytes) -> Any:
        try:
            answer = json.loads(line)
        except ValueError:
            self._stop()
            raise ChildFailure(f"{self.target}: unreadable answer {line[:80]!r}") from None
        if not isinstance(answer, dict) or not ({"ok", "error"} & answer.keys()):
            self._stop()
            raise ChildFailure(f"{self.target}: unreadable answer {line[:80]!r}")
        if "error" in answer:
            raise ChildFailure(f"{self.target}: {answer['error']}")
        return answer["ok"]

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        with contextlib.suppress(OSError):
            self._stderr.seek(0)
            text = self._stderr.read().decode("utf-8", "replace")
            return " ".join(text.split())[-TAIL_CHARS:]
        return ""


_SHARED: dict[tuple[str, int], ChildCall] = {}
_SHARED_LOCK = threading.Lock()


def shared_child(target: str, warmup: list[Any] | None = None, memory_mb: int = MEMORY_MB) -> ChildCall:
    """This process's one ChildCall for `target` (started on first call; killed at exit); `warmup`: arguments of
    a first call the child makes before it says ready (lazy imports paid there, not in a timed call)."""
    with _SHARED_LOCK:
        child = _SHARED.get((target, memory_mb))
        if child is None:
            child = _SHARED[(target, memory_mb)] = ChildCall(target, warmup, memory_mb)
        return child


@atexit.register
def _close_shared() -> None:
    for child in list(_SHARED.values()):
        child.close()


def _forget_shared_in_fork() -> None:
    """A forked process must not talk to its parent's children over their pipes: it starts its own."""
    global _SHARED_LOCK
    _SHARED.clear()
    _SHARED_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_shared_in_fork)


# ---------------------------------------------------------------- the child's side


def _die_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies (best effort elsewhere)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _load(target: str) -> Any:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def serve(target: str, memory_mb: int, warmup: list[Any]) -> None:
    """Child main loop: import `target`, call it once on `warmup` (when given), say ready, then answer each JSON
    line of arguments with {"ok": result} or {"error": text}."""
    _die_with_parent()
    limit = memory_mb << 20
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    function = _load(target)
    if warmup:
        function(*warmup)
    out = sys.stdout.buffer
    out.write(b'"ready"\n')
    out.flush()
    for line in sys.stdin.buffer:
        try:
            answer = {"ok": function(*json.loads(line))}
        except Exception as err:  # the caller decides what a failure means
            answer = {"error": f"{type(err).__name__}: {' '.join(str(err).split())[:TAIL_CHARS]}"}
        out.write(json.dumps(answer).encode() + b"\n")
        out.flush()


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]) if len(sys.argv) > 3 else [])
