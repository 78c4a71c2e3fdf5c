"""Sandbox for untrusted programs (model-written code): limits, namespaces, a fresh uid.

    from k2post.sandbox import Sandbox, SandboxConfig
    result = Sandbox(SandboxConfig(cpu_s=2, wall_s=5)).run_python("print(1 + 1)")
    result.stdout, result.outcome            # ("2\\n", "ok")

Mechanisms (details and the hostile-program audit in docs/SANDBOX.md): a fresh unprivileged
uid per run, rlimits (CPU, address space, processes, file size, fds, no core), mount + pid +
ipc + uts namespaces with a read-only chroot and a size-capped tmpfs work dir, an empty
network namespace (or seccomp socket blocking), a seccomp deny-list, a minimal environment,
capped output, and cleanup by process group, pid namespace and uid sweep.
"""

from k2post.sandbox.config import NetworkMode, SandboxConfig, SandboxResult
from k2post.sandbox.runner import Sandbox, detect_isolation
from k2post.sandbox.uids import IsolationUnavailable, SandboxError, pids_of_uid

__all__ = [
    "IsolationUnavailable",
    "NetworkMode",
    "Sandbox",
    "SandboxConfig",
    "SandboxError",
    "SandboxResult",
    "detect_isolation",
    "pids_of_uid",
]
