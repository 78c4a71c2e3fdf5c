"""Sandbox uids: one fresh uid per concurrent run (flock'ed), process lookup and sweeping.

A uid of its own per run makes RLIMIT_NPROC count only that run's processes, lets cleanup
kill "every process of the uid" without touching anybody else, and keeps concurrent runs
from reading or signalling each other.
"""

from __future__ import annotations

import fcntl
import os
import random
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from k2post.command import UserError

LAUNCHER = Path(__file__).with_name("launcher.py")
WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm")


class SandboxError(RuntimeError):
    """The sandbox cannot run as configured (no uid free, isolation unavailable, ...)."""


class IsolationUnavailable(SandboxError, UserError):
    """`require_isolation` is set and the machine lacks root, namespaces or seccomp (a one-line user error)."""


def state_dir(configured: str) -> Path:
    """A private (0700, ours, not a symlink) dir for the uid lock files."""
    if configured:
        path = Path(configured)
    elif os.geteuid() == 0 and os.path.isdir("/run"):
        path = Path("/run/k2post-sandbox")
    else:
        path = Path(tempfile.gettempdir()) / f"k2post-sandbox-{os.geteuid()}"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise SandboxError(f"sandbox state dir {path} must be a 0700 dir owned by uid {os.geteuid()}")
    return path


@contextmanager
def allocate_uid(base: int, count: int, directory: Path) -> Iterator[int]:
    """Hold an flock on `<dir>/<uid>.lock` for a uid of [base, base+count) while in use."""
    start = random.randrange(count)
    for i in range(count):
        uid = base + (start + i) % count
        fd = os.open(directory / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            yield uid
        finally:
            os.close(fd)  # releases the lock
        return
    raise SandboxError(f"all {count} sandbox uids from {base} are in use")


def _uids_of(pid: str) -> tuple[set[int], bool]:
    """Real/effective/saved/fs uids of a process and whether it is a zombie."""
    with open(f"/proc/{pid}/status") as fh:
        lines = dict(line.split(":", 1) for line in fh if ":" in line)
    uids = {int(x) for x in lines.get("Uid", "").split()}
    return uids, lines.get("State", "").strip().startswith("Z")


def pids_of_uid(uid: int, include_zombies: bool = False) -> list[int]:
    """Pids (in this pid namespace) running with `uid` as any of their uids."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            uids, zombie = _uids_of(entry)
        except (OSError, ValueError):
            continue
        if uid in uids and (include_zombies or not zombie):
            found.append(int(entry))
    return found


def sweep_uid(uid: int, gid: int, timeout: float = 5.0) -> bool:
    """SIGKILL every process of `uid` (via a helper that becomes `uid`); True once none is left."""
    deadline = time.monotonic() + timeout
    while pids_of_uid(uid):
        if time.monotonic() > deadline:
            return False
        cmd = [sys.executable, "-I", "-S", str(LAUNCHER), "--sweep", str(uid), str(gid)]
        subprocess.run(cmd, env={"PATH": "/usr/bin:/bin"}, timeout=timeout, check=False)
        time.sleep(0.01)
    return True


def remove_owned(uid: int, dirs: tuple[str, ...] = WORLD_WRITABLE) -> list[str]:
    """Fallback cleanup: delete the top-level entries of `dirs` that `uid` created."""
    removed = []
    for base in dirs:
        try:
            entries = list(os.scandir(base))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid == uid:
                    subprocess.run(["rm", "-rf", "--one-file-system", entry.path], check=False)
                    removed.append(entry.path)
            except OSError:
                continue
    return removed
