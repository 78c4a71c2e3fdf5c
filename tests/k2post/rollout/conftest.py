"""Rollout fixtures: a tiny model trained to call the tool_use gym's bank tools (see tool_model.py)."""

from __future__ import annotations

import pytest

from k2post.envs.registry import make_environment

N_TOOL_TASKS = 3  # bank tasks the tool model memorizes; task 0 starts with a malformed call


@pytest.fixture(scope="session")
def bank_env():
    return make_environment("tool_use", {"toolsets": ["bank"]})


@pytest.fixture(scope="session")
def bank_tasks(bank_env):
    return list(bank_env.tasks("train", seed=0, n=N_TOOL_TASKS))


@pytest.fixture(scope="session")
def tool_trajectories(tiny_qwen2_dir, bank_env, bank_tasks):
    from k2post.models.loading import load_tokenizer
    from tool_model import reference_trajectory

    tokenizer = load_tokenizer(tiny_qwen2_dir)
    return [
        reference_trajectory(bank_env, task, tokenizer, malformed_first=(i == 0)) for i, task in enumerate(bank_tasks)
    ]


@pytest.fixture(scope="session")
def tool_model_dir(tiny_qwen2_dir, tool_trajectories, tmp_path_factory):
    """tiny-qwen2 overfit (~30 s) on the reference trajectories: greedy decoding replays them."""
    from tool_model import train_on

    out = tmp_path_factory.mktemp("tool-model") / "tiny-qwen2-bank"
    loss = train_on(tiny_qwen2_dir, out, tool_trajectories)
    assert loss < 0.01, f"tool model did not memorize its trajectories (worst loss {loss:.4f})"
    return out


@pytest.fixture(scope="module")
def tool_engine(tool_model_dir):
    """An in-process vLLM engine on the tool model, closed after the module (vLLM's parallel state
    is process-global: later modules may build engines of other architectures)."""
    from k2post.rollout.config import VLLMEngineConfig
    from k2post.rollout.vllm_engine import VLLMEngine

    # a fractional KV cache: the sleep test checks the engine allocated exactly kv_cache_gib (not whole GiB)
    cfg = VLLMEngineConfig(dtype="float32", max_model_len=2048, max_num_seqs=16, kv_cache_gib=0.25)
    engine = VLLMEngine(tool_model_dir, cfg)
    yield engine
    engine.close()
