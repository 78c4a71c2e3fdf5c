"""Data parallel (slow): `torchrun --nproc-per-node 2 -m k2post_pipelines.sft` equals one process with gradient
accumulation 2.

Both see the same 2 packed rows per step (rank r takes micro-batch r; the single process takes
both in turn) and normalize by the step's label tokens over all ranks, so the step-1 loss is
identical and later losses agree up to float summation order (DeepSpeed all-reduces the
gradients of the two ranks instead of accumulating them). The 2-rank run is then resumed from
its ZeRO-2 checkpoint (one optimizer-state file per rank) with more steps.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from data_helpers import tool_use_rows, write_dataset
from proc_helpers import run_bounded
from k2post.config.loader import validate_config
from k2post.sft.config import SFTConfig
from k2post.train.metrics import read_metrics
from k2post.train.distributed import free_port

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]


def _raw(run_dir: Path, dataset: Path, model_dir: Path, gas: int, steps: int) -> dict:
    return {
        "kind": "sft",
        "run_dir": str(run_dir),
        "model": {"path": str(model_dir), "flavor": None},
        "data": {"path": str(dataset), "eval_fraction": 0.2},
        "optim": {"lr": 3e-3},
        "train": {"max_steps": steps, "gradient_accumulation_steps": gas, "eval_every": 2},
        "schedule": {"kind": "constant", "warmup_steps": 1},
        "checkpoint": {"every": 2},
        "deepspeed": {"zero_stage": 2},
    }


def _torchrun(*args: str) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env["PYTHONPATH"] = str(REPO)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        str(free_port()),
        "-m",
        "k2post_pipelines.sft",
        *args,
    ]
    done = run_bounded(command, timeout=300, cwd=REPO, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]


def test_two_ranks_match_one_rank_with_accumulation(tiny_qwen2_dir):
    from k2post.sft.trainer import run_sft

    work = Path(tempfile.mkdtemp(prefix="k2post_sft_dp_"))
    try:
        dataset = write_dataset(tool_use_rows(12, seed=4), work / "dataset")
        single = run_sft(validate_config(SFTConfig, _raw(work / "single", dataset, tiny_qwen2_dir, 2, 4), "test"))
        config = work / "dp.yaml"
        config.write_text(yaml.safe_dump(_raw(work / "dp", dataset, tiny_qwen2_dir, 1, 4)))
        _torchrun(str(config))
        one, two = read_metrics(work / "single" / "metrics.jsonl"), read_metrics(work / "dp" / "metrics.jsonl")
        assert [r["step"] for r in one] == [r["step"] for r in two] == [0, 1, 2, 3, 4]
        assert [r.get("tokens") for r in one] == [r.get("tokens") for r in two]  # same rows per step
        assert two[1]["loss"] == pytest.approx(one[1]["loss"], rel=1e-6)
        for a, b in zip(one[2:], two[2:]):
            assert b["loss"] == pytest.approx(a["loss"], rel=2e-3), (a, b)
        assert two[-1]["eval_loss"] == pytest.approx(single["eval_loss_end"], rel=2e-3)
        worst = max(abs(b["loss"] - a["loss"]) / a["loss"] for a, b in zip(one[1:], two[1:]))
        print(f"2 ranks vs 1 rank x gas 2: max relative loss difference {worst:.2e}")

        _torchrun("--resume", str(work / "dp"), "train.max_steps=6")
        resumed = read_metrics(work / "dp" / "metrics.jsonl")
        assert [r["step"] for r in resumed] == [0, 1, 2, 3, 4, 5, 6] and resumed[:5] == two
        assert (work / "dp" / "final" / "model.safetensors").is_file()
    finally:
        shutil.rmtree(work, ignore_errors=True)
