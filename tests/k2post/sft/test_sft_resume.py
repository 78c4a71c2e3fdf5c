"""Resume (slow): a stopped or killed run continues to the same weights and loss curve as an uninterrupted one.

At ZeRO stages 0, 2 and 3 (single gloo process, gradient accumulation 2): run A goes 6 steps
straight; run B stops at step 3 (`train.stop_at_step`), then a second invocation with `resume: true` (the
library's field; `k2post sft --resume RUN_DIR` on the command line) finishes it. The final weights must be
bit-identical and every step's loss equal: the data stream and the lr are functions of the step, the engine
state (weights, ZeroMuonClip momentum / Adam moments) comes back from DeepSpeed's checkpoint bit for bit, and
CPU kernels are deterministic for equal inputs. A third run is SIGKILLed in a subprocess
(`k2post sft`) after its step-3 checkpoint appears and is resumed the same way.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
import yaml

from data_helpers import tool_use_rows, write_dataset
from proc_helpers import run_bounded
from k2post.config.loader import validate_config
from k2post.sft.config import SFTConfig
from k2post.train.metrics import read_metrics

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
STEPS = 6


@pytest.fixture(scope="module")
def work_dir():
    path = Path(tempfile.mkdtemp(prefix="k2post_sft_resume_"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def dataset(work_dir):
    return write_dataset(tool_use_rows(12, seed=1), work_dir / "dataset")


def _raw_config(run_dir: Path, dataset: Path, model_dir: Path, stage: int, **train) -> dict:
    # ZeRO-3 runs with INT4 QAT of the MLP projections: the fake-quant forward wrapper must see DeepSpeed's gathered
    # params and resume bit for bit (docs/QAT.md)
    qat = {"enabled": True, "modules": ["model.layers.*.mlp.*_proj"]} if stage == 3 else {"enabled": False}
    return {
        "qat": qat,
        "run_dir": str(run_dir),
        "model": {"path": str(model_dir), "flavor": None},
        "data": {"path": str(dataset), "eval_fraction": 0.2},
        "optim": {"lr": 3e-3},
        "train": {"max_steps": STEPS, "gradient_accumulation_steps": 2, "eval_every": 3, **train},
        "schedule": {"warmup_steps": 2},
        "checkpoint": {"every": 2, "keep": 3},
        "deepspeed": {"zero_stage": stage},
    }


def _run(raw: dict, **top) -> dict:
    from k2post.sft.trainer import run_sft

    return run_sft(validate_config(SFTConfig, {**raw, **top}, "test"))


def _weights(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(model_dir / "model.safetensors")


def _assert_same_run(a: Path, b: Path) -> None:
    wa, wb = _weights(a / "final"), _weights(b / "final")
    assert wa.keys() == wb.keys()
    diff = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
    assert diff == 0.0, f"resumed weights differ from the uninterrupted run by {diff}"
    keys = ("step", "loss", "lr", "tokens", "eval_loss")
    rows_a = [{k: r.get(k) for k in keys} for r in read_metrics(a / "metrics.jsonl")]
    rows_b = [{k: r.get(k) for k in keys} for r in read_metrics(b / "metrics.jsonl")]
    assert rows_a == rows_b


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_stop_and_resume_matches_an_uninterrupted_run(work_dir, dataset, tiny_qwen2_dir, stage):
    straight = _raw_config(work_dir / f"straight{stage}", dataset, tiny_qwen2_dir, stage)
    summary = _run(straight)
    assert summary["completed"] and summary["steps"] == STEPS

    stopped = _raw_config(work_dir / f"stopped{stage}", dataset, tiny_qwen2_dir, stage, stop_at_step=3)
    auto = {"resume": "auto"} if stage == 0 else {}  # auto: the same command starts the run, then continues it
    first = _run(stopped, **auto)
    assert not first["completed"] and first["steps"] == 3 and first["final_dir"] is None
    assert sorted(p.name for p in (work_dir / f"stopped{stage}" / "checkpoints").iterdir()) == ["step-2", "step-3"]
    with pytest.raises(ValueError, match="continue it with `k2post sft --resume "):
        _run(stopped)  # the run dir holds a run: refused without resume
    stopped["train"].pop("stop_at_step")
    second = _run(stopped, **(auto or {"resume": True}))
    assert second["completed"] and second["resumed_from"] == 3
    _assert_same_run(work_dir / f"straight{stage}", work_dir / f"stopped{stage}")


def test_resume_refuses_other_data(work_dir, dataset, tiny_qwen2_dir):
    raw = _raw_config(work_dir / "refuse", dataset, tiny_qwen2_dir, 0, stop_at_step=2)
    _run(raw)
    raw["train"].pop("stop_at_step")
    raw["train"]["seed"] = 7  # another shuffle: the data position of step 2 would be wrong
    with pytest.raises(ValueError, match="the train data or batch settings changed since this checkpoint"):
        _run(raw, resume=True)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # the session started for this run only
            pytest.fail(f"{path} did not appear (rc={proc.poll()}):\n{log.read_text()[-3000:]}")
        time.sleep(0.05)


def _cli_sft(work_dir: Path, name: str, raw: dict, *overrides: str) -> Path:
    """Write the config and run `k2post sft` on it to the end in a fresh process; returns the config path."""
    config = work_dir / f"sft_{name}.yaml"
    config.write_text(yaml.safe_dump({"kind": "sft", **raw}))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = run_bounded(
        [sys.executable, "-m", "k2post.cli", "sft", str(config), *overrides], timeout=420, cwd=REPO, env=env
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return config


def test_killed_run_resumes_to_the_same_weights(work_dir, dataset, tiny_qwen2_dir):
    """`k2post sft` in a subprocess, SIGKILLed right after step-3 is written; resuming finishes the run.

    Every run here is a fresh process (the reference too): the pytest process may have had its
    thread pool rebound by an earlier in-process vLLM engine, which changes float reductions."""
    reference = work_dir / "straight2_cli"
    _cli_sft(work_dir, "reference", _raw_config(reference, dataset, tiny_qwen2_dir, 2))
    run_dir = work_dir / "killed"
    raw = _raw_config(run_dir, dataset, tiny_qwen2_dir, 2)
    raw["checkpoint"].update(every=1, keep=10)
    config = work_dir / "sft_killed.yaml"
    config.write_text(yaml.safe_dump({"kind": "sft", **raw}))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with open(work_dir / "killed.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "k2post.cli", "sft", str(config)],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _wait_for(run_dir / "checkpoints" / "step-3", proc, timeout=240, log=work_dir / "killed.log")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (run_dir / "final").exists()
    done = run_bounded(
        [sys.executable, "-m", "k2post.cli", "sft", "--resume", str(run_dir)], timeout=420, cwd=REPO, env=env
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["completed"] and summary["resumed_from"] >= 3
    wa, wb = _weights(reference / "final"), _weights(run_dir / "final")
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) == 0.0
    losses = [r["loss"] for r in read_metrics(run_dir / "metrics.jsonl") if "loss" in r]
    assert losses == [r["loss"] for r in read_metrics(reference / "metrics.jsonl") if "loss" in r]


def test_bf16_engine_trains_and_saves(work_dir, dataset, tiny_qwen2_dir):
    """Smoke: deepspeed.precision bf16 at ZeRO-1 (fp32 masters in ZeroMuonClip) trains and writes a bf16 HF model."""
    raw = _raw_config(work_dir / "bf16", dataset, tiny_qwen2_dir, 1)
    raw["deepspeed"]["precision"] = "bf16"
    raw["train"].update(max_steps=3, eval_every=0)
    raw["schedule"].update(warmup_steps=0)
    raw["checkpoint"].update(every=0)
    summary = _run(raw)
    assert summary["completed"] and summary["train_loss_last"] < summary["train_loss_first"]
    weights = _weights(work_dir / "bf16" / "final")
    assert {w.dtype for w in weights.values()} == {torch.bfloat16}
