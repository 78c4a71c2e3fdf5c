"""The RL trainer trains exactly the tested loss: its DeepSpeed gradient equals autograd of the reference.

Two gloo ranks of the real `RLTrainerWorker` (ZeRO 1 and 2, 2 micro-batches per rank, PTX on, nonzero
log-ratios, IS token weights and a masked row) against one process that differentiates the K1.5 loss written out
by hand + ptx_coef * mean-over-ranks `ptx_loss` on the same rows (tests/k2post/rl/grad_worker.py).
Run: python -m pytest tests/k2post/rl/test_trainer_gradient.py -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from k2post.train.distributed import free_port
from proc_helpers import clean_child_env, wait_ranks

WORKER = Path(__file__).with_name("grad_worker.py")
REPO = Path(__file__).resolve().parents[3]
TIMEOUT_S = 420  # first DeepSpeed use JIT-builds its shm comm op (~30 s); a run takes ~20 s


def _ptx_dataset(path: Path) -> Path:
    from datasets import Dataset

    rows = [
        {
            "id": f"p{i}",
            "messages": json.dumps(
                [
                    {"role": "user", "content": f"What is {i} + {i}?"},
                    {"role": "assistant", "content": f"The answer is {2 * i}."},
                ]
            ),
        }
        for i in range(6)
    ]
    Dataset.from_list(rows).save_to_disk(str(path))
    return path


def _start(args: list[str], log: Path, worker: Path = WORKER, **env_vars: str) -> subprocess.Popen:
    """Start one worker script (`worker`) with `args`, its output into `log`, in its own session."""
    env = dict(
        clean_child_env(),
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        **env_vars,
    )
    with open(log, "w") as handle:
        return subprocess.Popen(
            [sys.executable, str(worker), *args],
            env=env,
            cwd=REPO,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_all(procs: list[tuple[subprocess.Popen, Path]]) -> None:
    wait_ranks(procs, time.monotonic() + TIMEOUT_S, "RL trainer gradient workers")


@pytest.fixture(scope="module")
def gradients(tiny_qwen2_dir, tmp_path_factory):
    """{"reference": grads, 1: grads, 2: grads} by param name."""
    out = tmp_path_factory.mktemp("rl_grad")
    common = ["--model", str(tiny_qwen2_dir), "--ptx", str(_ptx_dataset(out / "ptx")), "--out", str(out)]
    _wait_all([(_start([*common, "--reference"], out / "reference.log"), out / "reference.log")])
    for stage in (1, 2):
        port = str(free_port())
        logs = [out / f"stage{stage}_rank{rank}.log" for rank in range(2)]
        _wait_all(
            [
                (_start([*common, "--stage", str(stage), "--rank", str(rank), "--port", port], log), log)
                for rank, log in enumerate(logs)
            ]
        )
    load = lambda name: torch.load(out / name, weights_only=True)  # noqa: E731
    return {"reference": load("reference.pt"), 1: load("stage1.pt"), 2: load("stage2.pt")}


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2])
def test_deepspeed_trainer_gradient_equals_autograd_of_reference_loss(gradients, stage):
    ref, got = gradients["reference"], gradients[stage]
    assert set(got) == set(ref)
    total = torch.cat([g.reshape(-1) for g in ref.values()]).norm()
    assert total > 1e-3  # the loss has a gradient (advantages, log-ratios and PTX are nonzero)
    for name, want in ref.items():
        torch.testing.assert_close(got[name], want, rtol=1e-4, atol=1e-6 * float(total), msg=lambda m: f"{name}: {m}")
