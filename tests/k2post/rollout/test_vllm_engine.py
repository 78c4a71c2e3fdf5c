"""vLLM (CPU build, in-process) against transformers on the tiny Qwen2 built by `k2post model init`."""

from __future__ import annotations

import pytest

from k2post.chat.template import render_ids
from k2post.chat.types import Message
from k2post.models.loading import load_causal_lm, load_tokenizer
from k2post.rollout.config import SamplingConfig, VLLMEngineConfig
from k2post.rollout.hf_reference import hf_greedy

PROMPTS = [
    "What is 17 + 25?",
    "Name three colors.",
    "Call the weather tool for Paris.",
    "def add(a, b):",
    "Ünïcödé and emoji 🙂 are fine too.",
    "Summarize: the quick brown fox jumps over the lazy dog.",
]
MAX_NEW_TOKENS = 24


@pytest.fixture(scope="module")
def vllm_engine(tiny_qwen2_dir):
    from k2post.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine(tiny_qwen2_dir, VLLMEngineConfig(dtype="float32", max_model_len=512))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def prompt_ids(tiny_qwen2_dir):
    tokenizer = load_tokenizer(tiny_qwen2_dir)
    return [
        render_ids(tokenizer, [Message(role="user", content=p)], add_generation_prompt=True).input_ids for p in PROMPTS
    ]


@pytest.mark.slow
def test_greedy_vllm_equals_transformers(tiny_qwen2_dir, vllm_engine, prompt_ids):
    tokenizer = load_tokenizer(tiny_qwen2_dir)
    greedy = SamplingConfig(temperature=0.0, max_tokens=MAX_NEW_TOKENS)
    vllm_ids = [g[0].token_ids for g in vllm_engine.generate(prompt_ids, greedy)]
    hf_ids = hf_greedy(load_causal_lm(tiny_qwen2_dir), prompt_ids, MAX_NEW_TOKENS, {tokenizer.eos_token_id})
    assert all(len(ids) > 0 for ids in vllm_ids)
    assert vllm_ids == hf_ids


@pytest.mark.slow
def test_sampling_returns_n_samples_with_logprobs(vllm_engine, prompt_ids):
    sampling = SamplingConfig(temperature=1.0, max_tokens=8, n=3, seed=1)
    out = vllm_engine.generate(prompt_ids[:2], sampling)
    assert [len(per_prompt) for per_prompt in out] == [3, 3]
    for gen in out[0]:
        assert len(gen.logprobs) == len(gen.token_ids) > 0
        assert all(lp <= 0.0 for lp in gen.logprobs)
        assert gen.finish_reason in ("stop", "length")


@pytest.mark.slow
def test_seeded_requests_beyond_one_prefill_step_do_not_crash_and_repeat(vllm_engine):
    """64 seeded prompts of ~100 tokens (> the 2048-token step budget): with chunked prefill vLLM 0.32's CPU
    build crashed ('CPU Generator does not use offset'); the engine turns it off on CPU."""
    prompts = [[(7 * i + j) % 3000 + 20 for j in range(100)] for i in range(64)]
    sampling = SamplingConfig(temperature=1.0, max_tokens=4, seed=11)
    first = vllm_engine.generate(prompts, sampling)
    again = vllm_engine.generate(prompts, sampling)
    assert [g[0].token_ids for g in first] == [g[0].token_ids for g in again]
    assert all(len(g[0].token_ids) == 4 for g in first)


@pytest.mark.slow
def test_greedy_vllm_equals_transformers_tiny_k2(tiny_k2_dir, vllm_engine):
    """DeepSeek-V3 shapes (MLA disabled on CPU, MoE): greedy ids equal transformers'."""
    from k2post.rollout.vllm_engine import VLLMEngine

    vllm_engine.close()  # one architecture per process at a time (vLLM's parallel state)
    tokenizer = load_tokenizer(tiny_k2_dir)
    prompts = [
        render_ids(tokenizer, [Message(role="user", content=p)], add_generation_prompt=True).input_ids for p in PROMPTS
    ]
    engine = VLLMEngine(tiny_k2_dir, VLLMEngineConfig(dtype="float32", max_model_len=512, max_num_seqs=8))
    try:
        greedy = SamplingConfig(temperature=0.0, max_tokens=MAX_NEW_TOKENS)
        vllm_ids = [g[0].token_ids for g in engine.generate(prompts, greedy)]
    finally:
        engine.close()
    hf_ids = hf_greedy(load_causal_lm(tiny_k2_dir), prompts, MAX_NEW_TOKENS, {tokenizer.eos_token_id})
    assert vllm_ids == hf_ids
