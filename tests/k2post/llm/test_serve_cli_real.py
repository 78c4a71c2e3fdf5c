"""`k2post serve` as a command: it starts a healthy server and SIGTERM stops the server too."""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time

import httpx
import pytest

from k2post.llm.serve import free_port

pytestmark = pytest.mark.slow

STARTUP_TIMEOUT_S = 150


def _read_line_matching(process: subprocess.Popen, pattern: str, timeout_s: float) -> re.Match:
    """Read the command's stdout until a line matches `pattern` (or fail on exit / timeout)."""
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if selector.select(timeout=0.5):
            line = process.stdout.readline()
            if match := re.search(pattern, line):
                return match
            if not line and process.poll() is not None:
                break
    pytest.fail(f"`k2post serve` printed no line matching {pattern!r} (exit status {process.poll()})")


def test_cli_serve_starts_and_sigterm_stops_the_server(tiny_qwen2_dir, tmp_path):
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "k2post.cli",
        "serve",
        str(tiny_qwen2_dir),
        "--port",
        str(port),
        "--max-model-len",
        "256",
        "--log",
        str(tmp_path / "server.log"),
    ]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, text=True, start_new_session=True, env={**os.environ, "K2POST_API_KEY": ""}
    )
    server_pid = None
    try:
        match = _read_line_matching(process, r"at (http://127\.0\.0\.1:\d+/v1) \(pid (\d+)", STARTUP_TIMEOUT_S)
        base_url, server_pid = match.group(1), int(match.group(2))
        assert base_url == f"http://127.0.0.1:{port}/v1"
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200
        assert httpx.get(base_url + "/models", timeout=10).json()["data"][0]["id"] == str(tiny_qwen2_dir)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        deadline = time.monotonic() + 30  # the command returns once it signalled the group; a loaded box reaps late
        while _alive(server_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        with pytest.raises(ProcessLookupError):
            os.killpg(server_pid, 0)
    finally:
        _cleanup(process, server_pid)


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _cleanup(process: subprocess.Popen, server_pid: int | None) -> None:
    """After a failure: stop the command we started and, if it left one, the server group."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    if server_pid is not None:
        try:
            os.killpg(server_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
