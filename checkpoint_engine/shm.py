"""POSIX shared-memory segments (/dev/shm) mapped as torch uint8 tensors, with leak-proof cleanup.

Names are `<prefix>-<creator pid>-<hex>`. A segment's name is removed (unlinked) by its creator
as soon as the peer has mapped it; the mapping itself lives until both sides drop it. Until then
the name is unlinked by, whichever comes first: `unlink()`/`close()`, a `weakref.finalize`, an
`atexit` hook, or a SIGTERM/SIGINT/SIGHUP handler (which then chains to the previous handler). A
SIGKILLed creator cannot run any of these: `sweep_stale_segments` (run at every sender start)
unlinks segments whose creator pid is gone. Linux only (uses /dev/shm directly).
"""

from __future__ import annotations

import atexit
import mmap
import os
import re
import signal
import threading
import uuid
import weakref

import torch

from k2post_checkpoint_engine.errors import CheckpointEngineError

SHM_DIR = "/dev/shm"
_NAME_RE = re.compile(r"^[A-Za-z0-9_]+-[0-9]+-[0-9a-f]+$")
_live: dict[str, int] = {}  # names created (and not yet unlinked) by this process -> creator pid
_lock = threading.Lock()
_handlers_installed = False
_HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _unlink_name(name: str, creator_pid: int) -> None:
    """Unlink one segment name if this process created it (never from a forked child)."""
    if os.getpid() != creator_pid:
        return
    with _lock:
        _live.pop(name, None)
    try:
        os.unlink(os.path.join(SHM_DIR, name))
    except FileNotFoundError:
        pass


def unlink_all_live() -> None:
    """Unlink every segment this process created and still holds a name for."""
    for name, pid in list(_live.items()):
        _unlink_name(name, pid)


def _on_signal(signum: int, frame: object) -> None:
    unlink_all_live()
    prev = _previous_handlers.get(signum, signal.SIG_DFL)
    if callable(prev):
        prev(signum, frame)
    elif prev == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


_previous_handlers: dict[int, object] = {}


def _install_cleanup_hooks() -> None:
    """atexit always; signal handlers only from the main thread (Python's rule), once per process."""
    global _handlers_installed
    if _handlers_installed:
        return
    _handlers_installed = True
    atexit.register(unlink_all_live)
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in _HANDLED_SIGNALS:
        _previous_handlers[sig] = signal.getsignal(sig)
        signal.signal(sig, _on_signal)


def _map(fd: int, nbytes: int) -> tuple[mmap.mmap, torch.Tensor]:
    mm = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    return mm, torch.frombuffer(mm, dtype=torch.uint8, count=nbytes)


class ShmSegment:
    """One mapped segment; `.tensor` is a uint8 CPU tensor of `nbytes` over the shared memory."""

    def __init__(self, name: str, nbytes: int, mm: mmap.mmap, tensor: torch.Tensor, owner: bool) -> None:
        self.name, self.nbytes, self.owner = name, nbytes, owner
        self._mmap: mmap.mmap | None = mm
        self.tensor: torch.Tensor | None = tensor
        self._finalizer = weakref.finalize(self, _unlink_name, name, os.getpid()) if owner else None

    @classmethod
    def create(cls, prefix: str, nbytes: int) -> ShmSegment:
        """Create and map a new segment `<prefix>-<pid>-<hex>` of `nbytes` bytes."""
        _install_cleanup_hooks()
        name = f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:16]}"
        path = os.path.join(SHM_DIR, name)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        with _lock:
            _live[name] = os.getpid()
        try:
            os.ftruncate(fd, nbytes)
            mm, tensor = _map(fd, nbytes)
        except BaseException:
            _unlink_name(name, os.getpid())
            raise
        finally:
            os.close(fd)
        return cls(name, nbytes, mm, tensor, owner=True)

    @classmethod
    def attach(cls, name: str, nbytes: int) -> ShmSegment:
        """Map an existing segment created by another process (never unlinks it)."""
        if not _NAME_RE.match(name):
            raise CheckpointEngineError(f"refusing to attach shm segment with unexpected name {name!r}")
        try:
            fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
        except FileNotFoundError:
            raise CheckpointEngineError(f"shm segment {name!r} does not exist (sender gone?)") from None
        try:
            size = os.fstat(fd).st_size
            if size < nbytes:
                raise CheckpointEngineError(f"shm segment {name!r} has {size} bytes, expected {nbytes}")
            mm, tensor = _map(fd, nbytes)
        finally:
            os.close(fd)
        return cls(name, nbytes, mm, tensor, owner=False)

    def unlink(self) -> None:
        """Remove the name (creator only); existing mappings stay valid."""
        if self._finalizer is not None:
            self._finalizer()

    def close(self) -> None:
        """Unlink (if creator) and drop our references; the memory is unmapped when the last tensor
        viewing it dies. (Never `mmap.close()` here: torch.frombuffer tensors do not pin the buffer
        export, so an explicit close would unmap memory that live views still point to.)"""
        self.unlink()
        self.tensor = None
        self._mmap = None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def list_segments(prefix: str) -> list[str]:
    """Names in /dev/shm that look like checkpoint-engine segments with this prefix."""
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith(prefix + "-") and _NAME_RE.match(n))


def sweep_stale_segments(prefix: str = "k2ce") -> list[str]:
    """Unlink `<prefix>-<pid>-*` segments whose creator pid no longer exists; returns their names."""
    removed = []
    for name in list_segments(prefix):
        pid = int(name[len(prefix) + 1 :].split("-")[0])
        if pid != os.getpid() and not _pid_alive(pid):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                removed.append(name)
            except FileNotFoundError:
                pass
    return removed
