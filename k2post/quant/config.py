"""The `qat:` config section (torch-free: run configs validate before torch is imported)."""

from __future__ import annotations

from pydantic import Field

from k2post.config.base import K2Config


class QATConfig(K2Config):
    """INT4 weight-only QAT (K2 Thinking): fake quantization of the chosen modules' weights in the trainer."""

    enabled: bool = Field(False, description="Fake-quantize the target weights to INT4 in every trainer forward.")
    group_size: int = Field(32, gt=0, description="Weights per quantization group along the input dimension.")
    modules: list[str] = Field(
        default_factory=lambda: ["*.mlp.experts"],
        description="fnmatch patterns of module names whose weights (2+ dims) are quantized; default: the routed "
        "MoE experts only (K2 Thinking), not attention, the dense MLP, shared experts, embeddings or lm_head.",
    )
