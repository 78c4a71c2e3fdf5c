"""`ray job submit -- python -m k2post_pipelines.sft CONFIG` on a local head (slow), then the output model in vLLM.

The head (fixture `ray_head`, tests/pipelines/conftest.py) is ours alone: its own --temp-dir and ports,
RAY_AUTH_MODE=disabled, stopped by pid.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import yaml

from ray_jobs import submit

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "k2post" / "sft"))

pytestmark = pytest.mark.slow


def test_sft_as_a_ray_job_then_vllm(ray_head, tiny_qwen2_dir):
    from data_helpers import tool_use_rows, write_dataset

    address, env = ray_head
    work = Path(tempfile.mkdtemp(prefix="k2post_sft_ray_"))
    try:
        config = work / "sft_ray.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "kind": "sft",
                    "run_dir": str(work / "run"),
                    "model": {"path": str(tiny_qwen2_dir), "flavor": None},
                    "data": {
                        "path": str(write_dataset(tool_use_rows(10, seed=2), work / "dataset")),
                        "eval_fraction": 0.2,
                    },
                    "train": {"max_steps": 4, "eval_every": 2},
                    "schedule": {"warmup_steps": 1},
                    "checkpoint": {"every": 2},
                    "deepspeed": {"zero_stage": 2},
                }
            )
        )
        t0 = time.monotonic()
        job_id = f"k2post-sft-test-{uuid.uuid4().hex[:8]}"
        sft = ("python", "-m", "k2post_pipelines.sft", str(config), "train.log_every=1")
        job = submit(address, env, job_id, *sft, timeout=420)
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

    prompt = render_ids(
        load_tokenizer(model_dir), [Message(role="user", content="List my files.")], add_generation_prompt=True
    ).input_ids
    engine = VLLMEngine(model_dir, VLLMEngineConfig(dtype="float32", max_model_len=1024, max_num_seqs=2))
    try:
        generation = engine.generate([prompt], SamplingConfig(temperature=0.0, max_tokens=8))[0][0]
    finally:
        engine.close()
    assert generation.token_ids and len(generation.logprobs) == len(generation.token_ids)
