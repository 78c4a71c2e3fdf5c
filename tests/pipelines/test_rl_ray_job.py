"""`ray job submit --working-dir . -- python -m k2post_pipelines.rl CONFIG` on a local head (slow).

The head (fixture `ray_head`, tests/pipelines/conftest.py) has its own temp dir and ports and
RAY_AUTH_MODE set. The job joins that cluster (RAY_ADDRESS), runs one RL iteration with the
trainer and rollout actors placed by Ray, and must reach SUCCEEDED with a loadable model in its
run dir.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
import torch
import yaml

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent

pytestmark = pytest.mark.slow


def _rl_config(work: Path, model_dir: Path) -> Path:
    config = work / "rl_job.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "kind": "rl",
                "run_dir": str(work / "run"),
                "seed": 0,
                "model": {"path": str(model_dir), "flavor": None},
                "envs": [{"name": "instruction_following", "config": {"max_constraints": 2}}],
                "rollout": {
                    "prompts_per_iteration": 2,
                    "samples_per_prompt": 4,
                    "engine": {"dtype": "float32", "max_model_len": 512, "max_num_seqs": 16, "kv_cache_gib": 0.5},
                    "agentic": {"max_turns": 1, "max_turn_tokens": 24, "max_episode_tokens": 48},
                },
                "loss": {"groups_per_step": 2, "micro_batch_size": 8},
                "optim": {"lr": 0.02},
                "budget": {"default_max_tokens": 24, "penalty": "none"},
                "train": {"iterations": 1, "prompt_pool_per_env": 16, "eval_every": 0, "eval_tasks_per_env": 2},
                "checkpoint": {"every": 0},
            }
        )
    )
    return config


def _ray(env: dict, *args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(VENV_BIN / "ray"), *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def _job_status(address: str, env: dict, job_id: str) -> str:
    """The job's status as the job server reports it (JobSubmissionClient, in a child with the head's env)."""
    code = (
        "import sys; from ray.job_submission import JobSubmissionClient; "
        "print(JobSubmissionClient(sys.argv[1]).get_job_status(sys.argv[2]).value)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, address, job_id], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_rl_as_a_ray_job_succeeds_with_a_loadable_model(ray_head, tiny_qwen2_dir):
    from k2post.models.loading import load_causal_lm, load_tokenizer

    address, env = ray_head
    work = Path(tempfile.mkdtemp(prefix="k2post_rl_ray_"))
    job_id = f"k2post-rl-test-{uuid.uuid4().hex[:8]}"
    try:
        config = _rl_config(work, tiny_qwen2_dir)
        job = _ray(
            env,
            "job",
            "submit",
            "--address",
            address,
            "--submission-id",
            job_id,
            "--working-dir",
            str(REPO),
            "--",
            "python",
            "-m",
            "k2post_pipelines.rl",
            str(config),
            timeout=600,
        )
        output = job.stdout + job.stderr
        assert job.returncode == 0, output[-4000:]
        assert _job_status(address, env, job_id) == "SUCCEEDED"
        summary = json.loads((work / "run" / "summary.json").read_text())
        assert summary["completed"] and summary["optimizer_steps"] == 1
        assert '"completed": true' in output  # the job's own summary line came back through the job server
        model = load_causal_lm(work / "run" / "final")
        ids = load_tokenizer(work / "run" / "final")("hello", return_tensors="pt").input_ids
        with torch.no_grad():
            assert torch.isfinite(model(input_ids=ids).logits).all()
    finally:
        shutil.rmtree(work, ignore_errors=True)
