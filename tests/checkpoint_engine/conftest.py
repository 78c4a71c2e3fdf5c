"""Fixtures for the checkpoint-engine tests: a per-test shm prefix that must end up leak-free,
and the `_workers` helper module (model definition + subprocess entry points)."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from k2post_checkpoint_engine.shm import list_segments

_counter = itertools.count()
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def shm_prefix():
    """A /dev/shm name prefix unique to this test; asserts no segment with it survives the test."""
    prefix = f"k2cet{os.getpid()}x{next(_counter)}"
    yield prefix
    assert list_segments(prefix) == [], f"leaked shm segments: {list_segments(prefix)}"


@pytest.fixture(scope="session")
def workers():
    """tests/checkpoint_engine/_workers.py imported as a module."""
    path = Path(__file__).with_name("_workers.py")
    spec = importlib.util.spec_from_file_location("ce_test_workers", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["ce_test_workers"] = module
    spec.loader.exec_module(module)
    return module


class Launcher:
    """Starts `_workers.py` subprocesses and reaps them; only ever kills the pids it started."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.procs = tmp, []

    def start(self, role: str, args: dict) -> tuple[subprocess.Popen, Path]:
        idx = len(self.procs)
        result = self.tmp / f"{role}{idx}.json"
        log = open(self.tmp / f"{role}{idx}.log", "w")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "PYTHONPATH": str(REPO_ROOT)}
        cmd = [
            sys.executable,
            str(Path(__file__).with_name("_workers.py")),
            role,
            json.dumps({**args, "result": str(result)}),
        ]
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT, env=env)
        log.close()
        self.procs.append(proc)
        return proc, result

    def wait(self, procs: list[subprocess.Popen], timeout_s: float) -> None:
        """Wait for `procs`; on timeout kill them (by pid) and fail with their logs."""
        deadline = time.monotonic() + timeout_s
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill_all()
                logs = "\n".join(f.read_text()[-3000:] for f in sorted(self.tmp.glob("*.log")))
                pytest.fail(f"worker pid {p.pid} did not finish within {timeout_s} s\n{logs}")

    def kill_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(10)

    def result(self, path: Path) -> dict:
        """The worker's JSON result; fails the test (with all logs) unless it reports ok."""
        assert path.exists(), f"no result at {path}\n{self.logs()}"
        result = json.loads(path.read_text())
        assert result["ok"], f"{result.get('error')}\n{result.get('traceback')}\n{self.logs()}"
        return result

    def logs(self) -> str:
        return "\n".join(f"--- {f.name}\n{f.read_text()[-4000:]}" for f in sorted(self.tmp.glob("*.log")))


@pytest.fixture
def launcher(tmp_path):
    launch = Launcher(tmp_path)
    yield launch
    launch.kill_all()
