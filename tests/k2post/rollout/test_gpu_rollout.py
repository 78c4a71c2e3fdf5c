"""GPU path of the rollout engine: vLLM sleep mode and in-place pushes on CUDA. Marked `gpu`:
skipped without CUDA (their CPU twins: test_engine_chat_sleep.py, test_weight_update.py).

Run on a GPU machine: `python -m pytest tests/k2post/rollout/test_gpu_rollout.py -m gpu -q`
(needs the `vllm` CUDA build: `pip install -e '.[gpu]'`).
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from k2post.rollout.config import SamplingConfig, VLLMEngineConfig

pytestmark = [pytest.mark.gpu, pytest.mark.slow]
PROMPTS = [[2, 17, 3, 40, 41, 42, 99], [5, 6, 7, 8, 9, 10, 11]]
GREEDY = SamplingConfig(temperature=0.0, max_tokens=12)


def _engine(path, **cfg):
    from k2post.rollout.vllm_engine import VLLMEngine

    return VLLMEngine(
        path, VLLMEngineConfig(dtype="bfloat16", max_model_len=256, max_num_seqs=8, gpu_memory_utilization=0.3, **cfg)
    )


def _greedy(engine) -> list[list[int]]:
    return [g[0].token_ids for g in engine.generate(PROMPTS, GREEDY)]


def test_sleep_mode_frees_gpu_memory_and_wakes_up_identical(tiny_qwen2_dir):
    engine = _engine(tiny_qwen2_dir)
    try:
        assert not engine.cpu and engine.weight_update_mode == "in_place"
        before = _greedy(engine)
        slept = engine.sleep(level=1)
        assert slept.nbytes > 0, "vLLM sleep mode freed no device memory"
        woke = engine.wake_up()
        assert woke.nbytes > 0 and _greedy(engine) == before
    finally:
        engine.close()


def test_level2_sleep_then_push_restores_weights(tiny_qwen2_dir):
    engine = _engine(tiny_qwen2_dir)
    try:
        before = _greedy(engine)
        engine.sleep(level=2)  # weights discarded: the next push refills them
        engine.wake_up()
        engine.load_weights(sorted(load_file(str(tiny_qwen2_dir / "model.safetensors")).items()))
        assert _greedy(engine) == before
    finally:
        engine.close()


def test_cuda_in_place_push_equals_fresh_engine(tiny_qwen2_dir, tmp_path):
    import shutil

    from safetensors.torch import save_file

    tensors = load_file(str(tiny_qwen2_dir / "model.safetensors"))
    gen = torch.Generator().manual_seed(1)
    noisy = {n: (t + 0.05 * torch.randn(t.shape, generator=gen)).contiguous() for n, t in sorted(tensors.items())}
    noisy_dir = tmp_path / "noisy"
    shutil.copytree(tiny_qwen2_dir, noisy_dir)
    save_file(noisy, str(noisy_dir / "model.safetensors"), metadata={"format": "pt"})
    engine = _engine(tiny_qwen2_dir)
    engine.load_weights(sorted(noisy.items()))
    pushed = _greedy(engine)
    fresh = _engine(noisy_dir)
    assert _greedy(fresh) == pushed
    fresh.close()
    engine.close()
