"""Run a child command with a hard deadline that also ends its grandchildren.

`subprocess.run(..., capture_output=True, timeout=T)` kills only the direct child on timeout and
then waits for the pipes to close: a grandchild (a torchrun rank, a Ray worker) that still holds
them makes that wait endless. `run_bounded` starts the child in its own session, writes its
output to files, and on timeout SIGKILLs the whole process group it started, then fails the test
with the output's tail.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest


def run_bounded(cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """Like subprocess.run(cmd, capture_output=True, text=True, timeout=...), without the pipe hang."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, start_new_session=True, **kwargs)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            _kill_group(proc.pid)  # leftovers of the group we started (none after a clean exit)
            proc.wait()
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    if rc is None:
        pytest.fail(
            f"{' '.join(map(str, cmd[:6]))} ... ran past {timeout:.0f}s; output tail:\n{(stdout + stderr)[-4000:]}"
        )
    return subprocess.CompletedProcess(cmd, rc, stdout, stderr)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


CHILD_ENV_DROPPED = (
    "VLLM_",
    "TORCHELASTIC_",
    "LOCAL_WORLD_SIZE",
    "GROUP_",
    "ROLE_",
    "OMP_",
    "KMP_",
    "LD_PRELOAD",
    "CUDA_",
)


def clean_child_env() -> dict[str, str]:
    """This process's environment without what earlier in-process engines (vLLM, torch.distributed
    launchers) may have left in it, for child ranks that must see only their own launch variables."""
    return {k: v for k, v in os.environ.items() if not k.startswith(CHILD_ENV_DROPPED)}


def wait_ranks(procs: list[tuple[subprocess.Popen, Path]], deadline: float, what: str = "workers") -> None:
    """Wait for processes started each in its own session (with their log files); on a timeout or a failure
    SIGKILL the sessions still running and fail the test with the logs' tails."""
    failed = []
    for proc, log in procs:
        try:
            rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            rc = "timeout"
        if rc != 0:
            failed.append(f"{log.name}: rc={rc}\n" + log.read_text()[-3000:])
    if failed:
        for proc, _ in procs:
            if proc.poll() is None:
                _kill_group(proc.pid)
                proc.wait()
        pytest.fail(f"{what} failed:\n" + "\n".join(failed))
