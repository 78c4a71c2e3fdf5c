"""A private Ray head for `ray job submit` tests: its own --temp-dir and ports, RAY_AUTH_MODE=disabled.

The head runs in its own session and is stopped by signalling exactly the processes of that
session and their descendants (`ray stop` would stop every Ray on the machine).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

VENV_BIN = Path(sys.executable).parent


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def _process_table() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, pgid) of every process."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            table[int(entry)] = (int(fields[1]), int(fields[2]))
    return table


def _session_tree(pgid: int) -> set[int]:
    """Processes of process group `pgid` (our `ray start` session) and all their descendants."""
    table = _process_table()
    mine = {pid for pid, (_, group) in table.items() if group == pgid}
    grew = True
    while grew:
        children = {pid for pid, (ppid, _) in table.items() if ppid in mine} - mine
        mine |= children
        grew = bool(children)
    return mine


def _alive(pid: int) -> bool:
    """Whether `pid` still runs (a zombie waiting to be reaped has stopped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _stop_tree(pgid: int, grace_s: float = 2.0) -> None:
    """SIGTERM our head's processes, then SIGKILL whatever is left after `grace_s`."""
    pids = _session_tree(pgid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
            time.sleep(0.1)
        pids = {pid for pid in pids if _alive(pid)}
        if not pids:
            return


@pytest.fixture
def ray_head():
    temp = Path(tempfile.mkdtemp(prefix="k2ray_", dir="/tmp"))  # short: unix socket paths have a length limit
    gcs, dashboard, client, agent = _free_ports(4)
    env = dict(os.environ, RAY_AUTH_MODE="disabled", PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}")
    command = [
        str(VENV_BIN / "ray"),
        "start",
        "--head",
        "--temp-dir",
        str(temp),
        "--port",
        str(gcs),
        "--include-dashboard",
        "true",
        "--dashboard-host",
        "127.0.0.1",
        "--dashboard-port",
        str(dashboard),
        "--ray-client-server-port",
        str(client),
        "--dashboard-agent-listen-port",
        str(agent),
        "--num-cpus",
        "2",
        "--disable-usage-stats",
    ]
    start = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = start.communicate(timeout=120)
        assert start.returncode == 0, out[-3000:]
        yield f"http://127.0.0.1:{dashboard}", env
    finally:
        _stop_tree(start.pid)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="session")
def coin_policy_dir(tiny_qwen2_dir, tmp_path_factory):
    """A tiny-qwen2 that samples a passing or a failing reply to lowercase prompts (tests/pipelines/coin_policy.py)."""
    from coin_policy import train_coin_policy

    return train_coin_policy(tiny_qwen2_dir, tmp_path_factory.mktemp("coin") / "policy")
