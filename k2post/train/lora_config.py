"""The `lora:` section of an RL run: LoRA adapters (peft) on the attention and MLP projections.

    lora: {enabled: true, rank: 16, alpha: 32, target_modules: [q_proj, k_proj, v_proj, o_proj]}

With LoRA the base weights are frozen and only the adapters train, with AdamW (never Muon: `k2post.train.lora`
says why); the engines get the merged weights W + (alpha / rank) B A under the base model's names (docs/RL.md,
"LoRA"). Torch-free, like every config model.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from k2post.config.base import K2Config

DEFAULT_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
MLA_TARGETS = ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]


class LoRAConfig(K2Config):
    """LoRA adapters through peft: which projections, their rank and scale."""

    enabled: bool = Field(False, description="Train LoRA adapters instead of the full weights (the base is frozen).")
    rank: int = Field(16, ge=1, description="Adapter rank r: A is [r, in], B is [out, r].")
    alpha: float = Field(32.0, gt=0, description="Adapter scale numerator: the update is (alpha / rank) B A.")
    target_modules: list[str] = Field(
        default_factory=lambda: list(DEFAULT_TARGETS),
        min_length=1,
        description="Linear modules that get adapters, by name suffix as peft matches them (default: the attention "
        "and MLP projections of Llama/Qwen-style models; MLA models name theirs q_a_proj, q_b_proj, "
        "kv_a_proj_with_mqa, kv_b_proj, o_proj). Fused MoE expert weights are not linear modules and stay frozen.",
    )
    push: Literal["merged", "adapter"] = Field(
        "merged",
        description="What a weight push sends: merged (default): W + (alpha / rank) B A under the base model's names, "
        "which any engine loads; adapter: only A and B of every target (megabytes), into an engine built with vLLM's "
        "LoRA support (RL sets rollout.engine.lora_max_rank), which applies them at every generation.",
    )
