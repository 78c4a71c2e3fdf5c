"""Trainer offload during rollout: params + optimizer state leave the device and come back unchanged.

On a GPU (marker `gpu`) DeepSpeed's `offload_states` frees the device memory and the next step
equals one taken without offloading. The CPU twin checks that offload is a reported no-op and
that training with it enabled is bit-identical to training with it disabled.
"""

from __future__ import annotations

import pytest
import torch

from k2post.config.loader import validate_config
from k2post.rl.batch import TrainSequence
from k2post.rl.run_config import RLConfig
from k2post.train.distributed import free_port


def _worker(model_dir, offload: bool, zero_stage: int = 1):
    from k2post.rl.trainer import RLTrainerWorker

    raw = {
        "model": {"path": str(model_dir), "flavor": None},
        "envs": [{"name": "math"}],
        "rollout": {"samples_per_prompt": 2, "agentic": {"max_turn_tokens": 32, "max_episode_tokens": 64}},
        "budget": {"default_max_tokens": 32},
        "loss": {"groups_per_step": 2, "micro_batch_size": 4},
        "optim": {"lr": 0.01},
        "trainer": {"world_size": 1, "zero_stage": zero_stage, "offload_during_rollout": offload},
    }
    return RLTrainerWorker(validate_config(RLConfig, raw, "test"), str(model_dir), 0, free_port())


def _rows() -> list[TrainSequence]:
    return [
        TrainSequence(list(range(5, 5 + n)), [0, 0] + [1] * (n - 2), adv, f"g/{i}")
        for i, (n, adv) in enumerate([(9, 0.5), (7, -0.5), (11, 1.0), (6, -1.0)])
    ]


def _two_steps(worker) -> dict[str, torch.Tensor]:
    for step in range(2):
        worker.offload()  # the engines would generate now
        worker.reload()
        rows = _rows()
        worker.train_step([rows], [worker.sequence_logprobs(rows)], step)
    return {k: v.detach().cpu().clone() for k, v in worker.engine.module.state_dict().items()}


def test_cpu_offload_is_a_reported_no_op_and_changes_nothing(tiny_qwen2_dir):
    worker = _worker(tiny_qwen2_dir, offload=True)
    try:
        report = worker.offload()
        assert (
            report["offloaded"] is False and "no device" in report["reason"] and worker.reload() == {"reloaded": False}
        )
        with_offload = _two_steps(worker)
    finally:
        worker.close()
    worker = _worker(tiny_qwen2_dir, offload=False)
    try:
        without = _two_steps(worker)
    finally:
        worker.close()
    assert all(torch.equal(with_offload[k], without[k]) for k in without)


@pytest.mark.gpu
@pytest.mark.parametrize("zero_stage", [0, 1, 2])
def test_gpu_offload_frees_device_memory_and_training_is_unchanged(tiny_qwen2_dir, zero_stage):
    worker = _worker(tiny_qwen2_dir, offload=True, zero_stage=zero_stage)
    try:
        rows = _rows()
        worker.train_step([rows], [worker.sequence_logprobs(rows)], 0)  # creates the optimizer state
        held = torch.cuda.memory_allocated()
        report = worker.offload()
        assert report["offloaded"] and torch.cuda.memory_allocated() < held / 2
        assert worker.reload() == {"reloaded": True} and torch.cuda.memory_allocated() >= held * 0.9
        with_offload = _two_steps(worker)
    finally:
        worker.close()
    worker = _worker(tiny_qwen2_dir, offload=False, zero_stage=zero_stage)
    try:
        worker.train_step([rows], [worker.sequence_logprobs(rows)], 0)
        without = _two_steps(worker)
    finally:
        worker.close()
    assert all(torch.allclose(with_offload[k], without[k], atol=1e-6) for k in without)
