"""Config and result models of the sandbox (see `k2post.sandbox` and docs/SANDBOX.md)."""

from __future__ import annotations

import signal
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from k2post.config.base import K2Config

NetworkMode = Literal["auto", "namespace", "blocked"]


class SandboxConfig(K2Config):
    """Limits and isolation of one sandboxed run."""

    cpu_s: int = Field(5, ge=1, le=3600, description="CPU seconds per process (RLIMIT_CPU; SIGKILL one second later).")
    wall_s: float = Field(10.0, gt=0, le=3600, description="Wall-clock limit of the whole run, setup included.")
    memory_mb: int = Field(512, ge=32, description="Address space per process in MiB (RLIMIT_AS).")
    max_processes: int = Field(32, ge=1, description="Processes + threads of the sandbox uid (RLIMIT_NPROC).")
    max_file_mb: int = Field(16, ge=1, description="Largest file the program may write, MiB (RLIMIT_FSIZE).")
    max_disk_mb: int = Field(64, ge=1, description="Size of the sandbox tmpfs (work dir, /tmp, /dev/shm) in MiB.")
    max_inodes: int = Field(4096, ge=64, description="Number of files + dirs on the sandbox tmpfs.")
    max_open_files: int = Field(256, ge=16, description="Open file descriptors per process (RLIMIT_NOFILE).")
    max_output_bytes: int = Field(
        65536, ge=1024, description="Kept bytes of stdout and of stderr each; more kills the run (truncated)."
    )
    network: NetworkMode = Field(
        "auto",
        description="namespace: empty network namespace (error if impossible); blocked: seccomp denies "
        "non-AF_UNIX sockets; auto: namespace when the kernel allows, else blocked.",
    )
    namespaces: bool = Field(
        True, description="Use mount/pid/ipc/uts namespaces + chroot when the kernel allows (False: weaker fallback)."
    )
    seccomp: bool = Field(
        True, description="Install the seccomp deny-list (mount, unshare, ptrace, bpf, io_uring, ...)."
    )
    require_isolation: bool = Field(
        True,
        description="Refuse to run (one line at start, naming what is missing) unless the machine grants root, "
        "namespaces and seccomp; false: run with whatever it grants (the weaker fallback: docs/SANDBOX.md).",
    )
    python: str = Field("", description="Interpreter for run_python; empty: the real path of the running one.")
    nice: int = Field(10, ge=0, le=19, description="Niceness added to the sandboxed program.")
    uid_base: int = Field(1_900_000_000, ge=100_000, description="First uid of the range sandbox uids come from.")
    uid_count: int = Field(1024, ge=1, description="Size of the sandbox uid range (one uid per concurrent run).")
    tmp_dir: str = Field("", description="Where temp trees are created; empty: the system temp dir.")
    state_dir: str = Field("", description="Dir of the uid lock files; empty: /run/k2post-sandbox or a temp dir.")

    @model_validator(mode="after")
    def _isolation_consistent(self) -> "SandboxConfig":
        off = [name for name in ("namespaces", "seccomp") if not getattr(self, name)]
        if off and self.require_isolation:
            raise ValueError(f"{' and '.join(off)}: false turns isolation down: also set require_isolation: false")
        return self


class SandboxResult(BaseModel):
    """Outcome of one sandboxed run."""

    model_config = ConfigDict(frozen=True)

    returncode: int | None = Field(None, description="Exit code; -N when killed by signal N; None if unknown.")
    stdout: str = Field("", description="Captured stdout (UTF-8, errors replaced), at most max_output_bytes.")
    stderr: str = Field("", description="Captured stderr, at most max_output_bytes.")
    timed_out: bool = Field(False, description="The wall-clock limit was hit and the run was killed.")
    cpu_limited: bool = Field(False, description="Killed by the CPU-time limit (SIGXCPU / SIGKILL).")
    oom: bool = Field(False, description="Failed for lack of memory (MemoryError / ENOMEM under RLIMIT_AS).")
    killed_by_signal: int | None = Field(None, description="Signal that ended the program, if any.")
    truncated: bool = Field(False, description="Output went over max_output_bytes; the run was killed.")
    disk_limited: bool = Field(
        False, description="Killed by the disk watch of the fallback mode (no tmpfs): over max_disk_mb/max_inodes."
    )
    wall_s: float = Field(0.0, description="Wall-clock seconds, setup included.")
    cpu_s: float = Field(0.0, description="CPU seconds of the program and its reaped children.")
    isolation: list[str] = Field(default_factory=list, description="Mechanisms that were in force.")
    error: str | None = Field(None, description="The sandbox itself failed (setup/exec), not the program.")

    @property
    def ok(self) -> bool:
        """Exited with 0 and hit no limit."""
        return self.returncode == 0 and self.outcome == "ok"

    @property
    def outcome(self) -> str:
        """One word: error, timeout, truncated, disk_limit, cpu_limit, oom, signal, exit_nonzero or ok."""
        checks = (
            (self.error is not None, "error"),
            (self.timed_out, "timeout"),
            (self.truncated, "truncated"),
            (self.disk_limited, "disk_limit"),
            (self.cpu_limited, "cpu_limit"),
            (self.oom, "oom"),
            (self.killed_by_signal is not None, "signal"),
            (self.returncode != 0, "exit_nonzero"),
        )
        return next((name for hit, name in checks if hit), "ok")

    @property
    def signal_name(self) -> str | None:
        """e.g. "SIGKILL" for killed_by_signal 9."""
        if self.killed_by_signal is None:
            return None
        try:
            return signal.Signals(self.killed_by_signal).name
        except ValueError:
            return str(self.killed_by_signal)
