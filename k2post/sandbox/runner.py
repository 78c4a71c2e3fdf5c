"""Parent side of the sandbox: plan the isolation, spawn the launcher, pump output, clean up.

    box = Sandbox(SandboxConfig(cpu_s=2, wall_s=5))
    result = box.run_python("print(sum(range(10)))")     # SandboxResult(returncode=0, stdout="45\\n", ...)

Every run gets a fresh uid (`uids.allocate_uid`), a fresh temp tree and, when the kernel
allows, fresh mount/pid/ipc/uts/net namespaces (`launcher.py`). The launcher is started with
`subprocess.Popen` in a new session (no preexec_fn: safe from threaded callers).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from k2post.sandbox.config import SandboxConfig, SandboxResult
from k2post.sandbox.uids import (
    IsolationUnavailable,
    LAUNCHER,
    WORLD_WRITABLE,
    SandboxError,
    allocate_uid,
    remove_owned,
    state_dir,
    sweep_uid,
)

logger = logging.getLogger(__name__)
SYSTEM_PYTHON = "/usr/bin/python3"
DRAIN_GRACE_S = 1.0
DISK_POLL_S = 0.05
LAUNCHER_GRACE_S = 2.0
MINIMAL_PATH = "/usr/local/bin:/usr/bin:/bin"
FileContent = str | bytes


@functools.lru_cache(maxsize=1)
def detect_isolation() -> dict[str, bool]:
    """What this machine grants (root, namespaces + tmpfs, network namespace, seccomp); cached."""
    scratch = tempfile.mkdtemp(prefix="k2sbx-probe-")
    try:
        cmd = [sys.executable, "-I", "-S", str(LAUNCHER), "--probe", scratch]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
        return {k: bool(v) for k, v in json.loads(out.stdout).items()}
    except (OSError, ValueError, subprocess.SubprocessError):
        return {"root": os.geteuid() == 0, "namespaces": False, "netns": False, "seccomp": False}
    finally:
        os.rmdir(scratch)


@dataclass
class Plan:
    """The isolation one run will use (decided up front, so the launcher never improvises)."""

    namespaces: bool
    netns: bool
    block_sockets: bool
    seccomp: bool
    root: bool


ISOLATION_NEEDS = {
    "root": "root (a fresh uid per run)",
    "namespaces": "mount/pid namespaces (a private root and process tree)",
    "seccomp": "seccomp (the syscall deny-list)",
}


def missing_isolation(caps: Mapping[str, bool]) -> list[str]:
    """What `require_isolation` needs that this machine does not grant."""
    return [need for cap, need in ISOLATION_NEEDS.items() if not caps.get(cap)]


_WARNED: set[tuple[str, ...]] = set()


def missing_warning(missing: tuple[str, ...]) -> bool:
    """True the first time this process meets `missing` (the warning is given once, not per sandbox)."""
    first = missing not in _WARNED
    _WARNED.add(missing)
    return first


def check_isolation(config: SandboxConfig, caps: Mapping[str, bool]) -> None:
    """IsolationUnavailable (one line, naming what is missing and the opt-out) when `require_isolation` is set
    and the machine lacks something it needs."""
    missing = missing_isolation(caps)
    if config.require_isolation and missing:
        raise IsolationUnavailable(
            f"the sandbox cannot isolate model-written code here: no {', no '.join(missing)}; run as root on a "
            "kernel with user namespaces, or set sandbox.require_isolation: false to accept the weaker fallback "
            "(docs/SANDBOX.md)"
        )


def make_plan(config: SandboxConfig, caps: Mapping[str, bool]) -> Plan:
    """Pick mechanisms from the config and the machine's capabilities; error if impossible (or if
    `require_isolation` is set and something it needs is missing)."""
    check_isolation(config, caps)
    netns = config.network != "blocked" and caps["netns"]
    if config.network == "namespace" and not netns:
        raise SandboxError("network='namespace' but no network namespace can be created here")
    use_seccomp = config.seccomp and caps["seccomp"]
    if not netns and not use_seccomp:
        raise SandboxError("cannot cut the network: no network namespace and no seccomp")
    return Plan(
        namespaces=config.namespaces and caps["namespaces"],
        netns=netns,
        block_sockets=not netns,
        seccomp=use_seccomp,
        root=caps["root"],
    )


def _reachable_by_others(path: str) -> bool:
    """Whether an unprivileged uid can traverse every parent dir and execute `path`."""
    p = Path(path)
    return all(os.stat(d).st_mode & stat.S_IXOTH for d in [p, *p.parents])


def interpreter(config: SandboxConfig, plan: Plan) -> str:
    """The python for run_python: configured, else our own (real path), else the system one."""
    python = os.path.realpath(config.python or sys.executable)
    if plan.namespaces or not plan.root or _reachable_by_others(python):
        return python
    if os.path.exists(SYSTEM_PYTHON) and _reachable_by_others(os.path.realpath(SYSTEM_PYTHON)):
        return os.path.realpath(SYSTEM_PYTHON)
    raise SandboxError(f"{python} is not reachable by the sandbox uid and {SYSTEM_PYTHON} is missing")


def _check_name(name: str) -> PurePosixPath:
    rel = PurePosixPath(name)
    if not name or rel.is_absolute() or ".." in rel.parts or str(rel) == ".":
        raise SandboxError(f"bad sandbox file name {name!r}: must be relative, without '..'")
    return rel


@contextmanager
def temp_tree(config: SandboxConfig, files: Mapping[str, FileContent], stdin: bytes) -> Iterator[Path]:
    """A fresh 0711 root-owned temp dir with files/ (the program's files) and stdin; removed after."""
    tmp = Path(tempfile.mkdtemp(prefix="k2sbx-", dir=config.tmp_dir or None))
    try:
        os.chmod(tmp, 0o711)
        (tmp / "files").mkdir(mode=0o700)
        for name, content in files.items():
            target = tmp / "files" / _check_name(name)
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            target.write_bytes(content.encode("utf-8", "surrogateescape") if isinstance(content, str) else content)
        (tmp / "stdin").write_bytes(stdin)
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if tmp.exists():  # deep trees beat rmtree's recursion
            subprocess.run(["rm", "-rf", "--one-file-system", str(tmp)], check=False)


def payload_env(plan: Plan, tmp: Path, extra: Mapping[str, str]) -> dict[str, str]:
    """A minimal environment: nothing of ours (tokens, keys) reaches the program."""
    home = "/sandbox" if plan.namespaces else str(tmp / "work")
    tmpdir = "/tmp" if plan.namespaces else home
    env = {"PATH": MINIMAL_PATH, "HOME": home, "TMPDIR": tmpdir, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    return {**env, "PYTHONDONTWRITEBYTECODE": "1", **extra}


def binds_for(program: str) -> list[str]:
    """Extra read-only binds: the prefix of the interpreter (its stdlib, libpython)."""
    real = Path(os.path.realpath(program))
    return [str(real.parent.parent)] if real.parent.name == "bin" else [str(real.parent)]


@dataclass
class _Pump:
    """Output collected from the launcher's stdout, stderr and status pipe."""

    cap: int
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)
    status: bytearray = field(default_factory=bytearray)
    truncated: bool = False
    timed_out: bool = False
    disk_limited: bool = False

    def add(self, name: str, data: bytes) -> None:
        if name == "status":
            self.status += data[: 1 << 20]
            return
        buf = self.out if name == "out" else self.err
        room = self.cap - len(buf)
        buf += data[: max(room, 0)]
        self.truncated |= len(data) > room

    def events(self) -> dict[str, dict[str, Any]]:
        """Parsed status events by name (unparsable lines are ignored)."""
        found: dict[str, dict[str, Any]] = {}
        for line in bytes(self.status).splitlines():
            try:
                event = json.loads(line)
                found.setdefault(str(event["event"]), event)
            except (ValueError, KeyError, TypeError):
                continue
        return found


def pump(
    pipes: Mapping[int, str],
    sink: _Pump,
    deadline: float,
    stop_on_overflow: bool = True,
    watch: DiskWatch | None = None,
) -> bool:
    """Read all pipes until EOF (True), the deadline, an output overflow or the disk watch fires."""
    with selectors.DefaultSelector() as sel:
        for fd, name in pipes.items():
            sel.register(fd, selectors.EVENT_READ, name)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0 or (stop_on_overflow and sink.truncated):
                return False
            if watch is not None and watch.over():
                sink.disk_limited = True
                return False
            for key, _ in sel.select(min(left, DISK_POLL_S) if watch else left):
                data = os.read(key.fd, 65536)
                if data:
                    sink.add(key.data, data)
                else:
                    sel.unregister(key.fd)
    return True


class DiskWatch:
    """Fallback quota (no tmpfs): bytes and inodes under the work dir plus what the uid put in /tmp & co."""

    def __init__(self, work: Path, uid: int, max_bytes: int, max_inodes: int) -> None:
        self.work, self.uid, self.max_bytes, self.max_inodes = work, uid, max_bytes, max_inodes

    def _roots(self) -> list[str]:
        roots = [str(self.work)]
        for base in WORLD_WRITABLE:
            try:
                roots += [e.path for e in os.scandir(base) if e.stat(follow_symlinks=False).st_uid == self.uid]
            except OSError:
                continue
        return roots

    def over(self) -> bool:
        """Walk (stopping early) and tell whether a limit is exceeded."""
        total = count = 0
        stack = self._roots()
        while stack:
            path = stack.pop()
            try:
                info = os.lstat(path)
                if stat.S_ISDIR(info.st_mode):
                    stack += [e.path for e in os.scandir(path)]
            except OSError:
                continue
            total, count = total + info.st_blocks * 512, count + 1
            if total > self.max_bytes or count > self.max_inodes:
                return True
        return False


class Sandbox:
    """Runs programs under the limits and isolation of a `SandboxConfig`."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        """Checks `require_isolation` now, so a run that would score without isolation stops at its start."""
        self.config = config if config is not None else SandboxConfig()
        caps = detect_isolation()
        check_isolation(self.config, caps)
        missing = missing_isolation(caps)
        if missing and missing_warning(tuple(missing)):
            logger.warning("k2post: warning: sandbox without %s (require_isolation: false)", ", ".join(missing))

    def run_python(
        self, code: str, files: Mapping[str, FileContent] | None = None, args: Sequence[str] = (), stdin: bytes = b""
    ) -> SandboxResult:
        """Run `code` as main.py with `python -I -S -B` (stdlib only) in the sandbox."""
        plan = make_plan(self.config, detect_isolation())
        python = interpreter(self.config, plan)
        all_files = {**(files or {}), "main.py": code}
        return self._run([python, "-I", "-S", "-B", "main.py", *args], all_files, stdin, {}, plan)

    def run(
        self,
        argv: Sequence[str],
        files: Mapping[str, FileContent] | None = None,
        stdin: bytes = b"",
        env: Mapping[str, str] | None = None,
    ) -> SandboxResult:
        """Run `argv` (argv[0] an absolute path, or a name found on /usr/bin:/bin) in the sandbox."""
        plan = make_plan(self.config, detect_isolation())
        program = argv[0] if argv[0].startswith("/") else shutil.which(argv[0], path=MINIMAL_PATH)
        if not program:
            raise SandboxError(f"program {argv[0]!r} not found on {MINIMAL_PATH}")
        return self._run([program, *argv[1:]], files or {}, stdin, env or {}, plan)

    def _run(
        self, argv: list[str], files: Mapping[str, FileContent], stdin: bytes, env: Mapping[str, str], plan: Plan
    ) -> SandboxResult:
        cfg = self.config
        with _uid_for(cfg, plan) as uid, temp_tree(cfg, files, stdin) as tmp:
            spec = self._spec(argv, env, plan, tmp, uid)
            started = time.monotonic()
            sink, usage_cpu = _execute(spec, tmp, cfg, _disk_watch(cfg, plan, tmp, uid))
            wall = time.monotonic() - started
            if uid is not None:
                if not sweep_uid(uid, uid):
                    logger.warning("sandbox uid %d still has processes after the sweep", uid)
                if not plan.namespaces:
                    remove_owned(uid)
        return build_result(sink, cfg, wall, usage_cpu)

    def _spec(self, argv: list[str], env: Mapping[str, str], plan: Plan, tmp: Path, uid: int | None) -> dict[str, Any]:
        cfg = self.config
        limits = ("cpu_s", "memory_mb", "max_processes", "max_file_mb", "max_open_files")
        return {
            "tmp": str(tmp),
            "uid": uid,
            "gid": uid,
            "namespaces": plan.namespaces,
            "netns": plan.netns,
            "seccomp": plan.seccomp,
            "block_sockets": plan.block_sockets,
            "argv": argv,
            "env": payload_env(plan, tmp, env),
            "binds": binds_for(argv[0]),
            "limits": {name: getattr(cfg, name) for name in limits},
            "disk_mb": cfg.max_disk_mb,
            "max_inodes": cfg.max_inodes,
            "nice": cfg.nice,
            "parent_pid": os.getpid(),
            "deadline_s": cfg.wall_s + LAUNCHER_GRACE_S,
        }


def _disk_watch(cfg: SandboxConfig, plan: Plan, tmp: Path, uid: int | None) -> DiskWatch | None:
    """Only the fallback needs it: with namespaces the tmpfs size/nr_inodes are the quota."""
    if plan.namespaces or uid is None:
        return None
    return DiskWatch(tmp / "work", uid, cfg.max_disk_mb << 20, cfg.max_inodes)


@contextmanager
def _uid_for(config: SandboxConfig, plan: Plan) -> Iterator[int | None]:
    """A fresh sandbox uid when we are root (after sweeping leftovers), else None."""
    if not plan.root:
        yield None
        return
    with allocate_uid(config.uid_base, config.uid_count, state_dir(config.state_dir)) as uid:
        sweep_uid(uid, uid)
        yield uid


def _execute(spec: dict[str, Any], tmp: Path, cfg: SandboxConfig, watch: DiskWatch | None) -> tuple[_Pump, float]:
    """Start the launcher, pump its pipes until done/deadline/overflow, kill, reap."""
    status_r, status_w = os.pipe()
    spec["status_fd"] = status_w
    sink = _Pump(cap=cfg.max_output_bytes)
    deadline = time.monotonic() + cfg.wall_s
    try:
        with open(tmp / "stdin", "rb") as stdin:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(LAUNCHER), json.dumps(spec)],
                stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(status_w,),
                start_new_session=True, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, cwd=tmp,
            )  # fmt: skip
    except BaseException:
        os.close(status_r)
        raise
    finally:
        os.close(status_w)
    assert proc.stdout is not None and proc.stderr is not None
    pipes = {proc.stdout.fileno(): "out", proc.stderr.fileno(): "err", status_r: "status"}
    try:
        if not pump(pipes, sink, deadline, watch=watch):
            sink.timed_out = not (sink.truncated or sink.disk_limited)
            _kill_group(proc.pid)
            pump(pipes, sink, time.monotonic() + DRAIN_GRACE_S, stop_on_overflow=False)
    finally:
        _kill_group(proc.pid)  # the launcher is not reaped yet, so its pgid cannot have been reused
        usage_cpu = _reap(proc)
        for f in (proc.stdout, proc.stderr):
            f.close()
        os.close(status_r)
    return sink, usage_cpu


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _reap(proc: subprocess.Popen[bytes]) -> float:
    """Wait for the launcher; CPU seconds of what it reaped (a fallback when no exit event came)."""
    if proc.returncode is not None:
        return 0.0
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime


def _oom(returncode: int | None, stderr: str) -> bool:
    markers = ("MemoryError", "Cannot allocate memory", "out of memory", "std::bad_alloc")
    return returncode not in (0, None) and any(m in stderr[-4000:] for m in markers)


def build_result(sink: _Pump, cfg: SandboxConfig, wall: float, usage_cpu: float) -> SandboxResult:
    """Turn the pumped output and status events into a SandboxResult."""
    events = sink.events()
    exit_event = events.get("exit")
    returncode = killed = None
    if exit_event is not None and not (sink.timed_out or sink.truncated or sink.disk_limited):
        returncode = os.waitstatus_to_exitcode(int(exit_event["status"]))
        killed = -returncode if returncode < 0 else None
    elif sink.timed_out or sink.truncated or sink.disk_limited:
        killed = signal.SIGKILL
    cpu = max(float(exit_event.get("cpu_s", 0.0)) if exit_event else 0.0, usage_cpu)
    stderr = sink.err.decode("utf-8", "replace")
    cpu_hit = killed == signal.SIGXCPU or (killed == signal.SIGKILL and cpu >= cfg.cpu_s - 0.1)
    error = events.get("error", {}).get("message") if "error" in events else None
    return SandboxResult(
        returncode=returncode,
        stdout=sink.out.decode("utf-8", "replace"),
        stderr=stderr,
        timed_out=sink.timed_out,
        cpu_limited=bool(cpu_hit and not (sink.timed_out or sink.truncated or sink.disk_limited)),
        oom=_oom(returncode, stderr),
        killed_by_signal=int(killed) if killed is not None else None,
        truncated=sink.truncated,
        disk_limited=sink.disk_limited,
        wall_s=round(wall, 4),
        cpu_s=round(cpu, 4),
        isolation=list(events.get("ready", {}).get("isolation", [])),
        error=str(error) if error is not None else None,
    )
