"""Configs of the MuonClip optimizer (Muon + AdamW routing + QK-Clip)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from k2post.config.base import K2Config


class QKClipConfig(K2Config):
    """Per-head QK-Clip (K2): after each step, heads whose max pre-softmax logit exceeded the threshold are rescaled."""

    renamed_fields = {"tau": "logit_threshold"}

    enabled: bool = Field(
        True, description="Record per-head max attention logits in the forward pass and clip after each optimizer step."
    )
    logit_threshold: float = Field(
        100.0,
        gt=0,
        description="QK-Clip's logit threshold, the paper's tau (K2: 100; small ablations: 30). Heads above it are "
        "scaled by gamma = threshold / S_max.",
    )


class OptimConfig(K2Config):
    """MuonClip: Muon for hidden 2-D (and per-expert 3-D) matrices, AdamW for the rest, QK-Clip after each step."""

    lr: float = Field(2e-4, gt=0, description="Learning rate, shared by the Muon and AdamW param groups.")
    weight_decay: float = Field(
        0.1,
        ge=0,
        description="Decoupled weight decay lambda (W <- W * (1 - lr * lambda)), applied with the unadjusted lr.",
    )
    momentum: float = Field(0.95, ge=0, lt=1, description="Muon momentum mu.")
    nesterov: bool = Field(True, description="Nesterov momentum for Muon: direction = g + mu * buf.")
    ns_steps: int = Field(5, ge=1, description="Newton-Schulz iterations.")
    ns_dtype: Literal["auto", "bfloat16", "float32"] = Field(
        "auto",
        description="Dtype of the Newton-Schulz iteration: auto = bfloat16 on GPU (as torch.optim.Muon), float32 on "
        "CPU (bf16 GEMMs are ~20x slower than fp32 on CPUs without native bf16).",
    )
    ns_eps: float = Field(1e-7, gt=0, description="eps in X0 = M / (||M||_F + eps).")
    ns_batch_numel: int = Field(
        1 << 26,
        ge=1,
        description="Most elements of same-shaped matrices orthogonalized in one batched Newton-Schulz call (a larger "
        "matrix is a batch of its own). The step's peak memory grows with it (~5x its bytes in the NS dtype); lower "
        "it when the optimizer step, not the forward, sets a rank's peak (docs/SCALING.md).",
    )
    rms_scale: float = Field(
        0.2, gt=0, description="Update RMS matching: O = NS(M) * rms_scale * sqrt(max(n, m)) (0.2 matches AdamW's RMS)."
    )
    adamw_betas: tuple[float, float] = Field(
        (0.9, 0.95), description="AdamW betas for embeddings, lm_head, norms, biases, router bias."
    )
    adamw_eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    adamw_patterns: list[str] = Field(
        default_factory=lambda: ["embed_tokens", "lm_head", "e_score_correction_bias"],
        description="Name substrings of >=2-D params routed to AdamW anyway (1-D params always go to AdamW).",
    )
    muon_patterns: list[str] = Field(
        default_factory=list,
        description="Name substrings forced to Muon (must match only >=2-D params; a 1-D match is an error).",
    )
    fused_row_splits: dict[str, int] = Field(
        default_factory=lambda: {"gate_up_proj": 2},
        description="Name substring -> k: a Muon param [.., k*n, m] whose name contains it stacks k matrices [n, m] "
        "along its rows (a fused MoE gate_up_proj holds gate and up); each is orthogonalized and RMS-scaled on its "
        "own, as K2 does for separate gate and up weights.",
    )
    qk_clip: QKClipConfig = Field(default_factory=QKClipConfig, description="QK-Clip settings.")

    @model_validator(mode="after")
    def _patterns_do_not_overlap(self) -> "OptimConfig":
        both = sorted(set(self.adamw_patterns) & set(self.muon_patterns))
        if both:
            raise ValueError(f"patterns {both} are in both adamw_patterns and muon_patterns: keep each in one list")
        bad = {key: k for key, k in self.fused_row_splits.items() if k < 1}
        if bad:
            raise ValueError(f"fused_row_splits {bad}: each split count must be >= 1 (1 = not fused)")
        return self
