"""`ray job submit -- python -m pipelines.sft CONFIG` on a local head (slow), then the output model in vLLM.

The head is ours alone: its own --temp-dir and ports (GCS, dashboard/job server, client server,
dashboard agent), RAY_AUTH_MODE=disabled, started in its own session. It is stopped by
signalling exactly the processes of that session and their descendants (`ray stop` would stop
every Ray on the machine).
"""

from __future__ import annotations

import json
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
import yaml

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
sys.path.insert(0, str(REPO / "tests" / "k2post" / "sft"))

pytestmark = pytest.mark.slow


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


def _stop_tree(pgid: int, grace_s: float = 10.0) -> None:
    """SIGTERM our head's processes, then SIGKILL whatever is left after `grace_s`."""
    pids = _session_tree(pgid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in pids):
            time.sleep(0.2)
        pids = {pid for pid in pids if Path(f"/proc/{pid}").exists()}
        if not pids:
            return


@pytest.fixture
def ray_head():
    temp = Path(tempfile.mkdtemp(prefix="k2ray_", dir="/tmp"))  # short: unix socket paths have a length limit
    gcs, dashboard, client, agent = _free_ports(4)
    env = dict(os.environ, RAY_AUTH_MODE="disabled", PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}")
    command = [str(VENV_BIN / "ray"), "start", "--head", "--temp-dir", str(temp), "--port", str(gcs),
               "--include-dashboard", "true", "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard),
               "--ray-client-server-port", str(client), "--dashboard-agent-listen-port", str(agent),
               "--num-cpus", "2", "--disable-usage-stats"]
    start = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    try:
        out, _ = start.communicate(timeout=120)
        assert start.returncode == 0, out[-3000:]
        yield f"http://127.0.0.1:{dashboard}", env
    finally:
        _stop_tree(start.pid)
        shutil.rmtree(temp, ignore_errors=True)


def test_sft_as_a_ray_job_then_vllm(ray_head, tiny_qwen2_dir):
    from data_helpers import tool_use_rows, write_dataset

    address, env = ray_head
    work = Path(tempfile.mkdtemp(prefix="k2post_sft_ray_"))
    try:
        config = work / "sft_ray.yaml"
        config.write_text(yaml.safe_dump({
            "kind": "sft", "run_dir": str(work / "run"),
            "model": {"path": str(tiny_qwen2_dir), "flavor": None},
            "data": {"path": str(write_dataset(tool_use_rows(10, seed=2), work / "dataset")), "eval_fraction": 0.2},
            "train": {"max_steps": 4, "eval_every": 2, "save_every": 2, "warmup_steps": 1},
            "deepspeed": {"zero_stage": 2},
        }))
        t0 = time.monotonic()
        job = subprocess.run(
            [str(VENV_BIN / "ray"), "job", "submit", "--address", address, "--working-dir", str(REPO), "--",
             "python", "-m", "pipelines.sft", str(config), "train.log_every=1"],
            env=env, cwd=REPO, capture_output=True, text=True, timeout=420,
        )
        job_s = time.monotonic() - t0
        output = job.stdout + job.stderr
        assert job.returncode == 0 and "succeeded" in output, output[-4000:]
        assert "step 4/4" in output  # the job's own log lines came back through the job server
        summary = json.loads((work / "run" / "summary.json").read_text())
        assert summary["completed"] and summary["eval_loss_end"] < summary["eval_loss_start"]
        print(f"ray job: {job_s:.1f}s")
        _generate_with_vllm(work / "run" / "final")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _generate_with_vllm(model_dir: Path) -> None:
    from k2post.chat.types import Message
    from k2post.models.loading import load_tokenizer
    from k2post.rollout.config import SamplingConfig, VLLMEngineConfig
    from k2post.rollout.vllm_engine import VLLMEngine
    from k2post.chat.template import render_ids

    prompt = render_ids(load_tokenizer(model_dir), [Message(role="user", content="List my files.")],
                        add_generation_prompt=True).input_ids
    engine = VLLMEngine(model_dir, VLLMEngineConfig(dtype="float32", max_model_len=1024, max_num_seqs=2))
    try:
        generation = engine.generate([prompt], SamplingConfig(temperature=0.0, max_tokens=8))[0][0]
    finally:
        engine.close()
    assert generation.token_ids and len(generation.logprobs) == len(generation.token_ids)
