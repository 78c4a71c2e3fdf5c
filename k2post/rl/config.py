"""Configs of the RL recipe's pure parts: budgets, length penalty, temperature decay, prompt sampling."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from k2post.config.base import K2Config


class BudgetConfig(K2Config):
    """Budget control (K2): per task type a max-token budget; a response that hits it is penalized."""

    default_max_tokens: int = Field(256, gt=0, description="Budget of task types not listed in `max_tokens`.")
    max_tokens: dict[str, int] = Field(
        default_factory=dict, description="Token budget per task type (e.g. math: 128, tool_use: 512)."
    )
    default_reasoning_max_tokens: int | None = Field(
        None,
        gt=0,
        description="Budget of reasoning tokens (inside <think>...</think>, summed over the episode's turns) of task "
        "types not listed in `reasoning_max_tokens`; null: reasoning counts only against `max_tokens`.",
    )
    reasoning_max_tokens: dict[str, int] = Field(
        default_factory=dict,
        description="Reasoning-token budget per task type (e.g. math: 96); an episode whose reasoning reaches it is "
        "cut there and penalized like any truncated response.",
    )
    penalty: Literal["replace", "subtract", "none"] = Field(
        "replace",
        description="What a truncated response gets: replace its reward by `penalty_value`, subtract `penalty_value`, "
        "or nothing.",
    )
    penalty_value: float = Field(
        0.0, description="The replacement reward (replace) or the amount subtracted (subtract)."
    )

    @model_validator(mode="after")
    def _positive_budgets(self) -> "BudgetConfig":
        for name, budgets in (("max_tokens", self.max_tokens), ("reasoning_max_tokens", self.reasoning_max_tokens)):
            bad = {k: v for k, v in budgets.items() if v <= 0}
            if bad:
                raise ValueError(f"budget.{name} must be positive, got {bad}")
        return self

    def budget_for(self, task_type: str) -> int:
        """The token budget of a task type."""
        return self.max_tokens.get(task_type, self.default_max_tokens)

    def reasoning_budget_for(self, task_type: str) -> int | None:
        """The reasoning-token budget of a task type (None: no separate budget)."""
        return self.reasoning_max_tokens.get(task_type, self.default_reasoning_max_tokens)


class LengthPenaltyConfig(K2Config):
    """The K1.5 length penalty over the K samples of a prompt (optional)."""

    enabled: bool = Field(False, description="Add the length reward lambda_i (K1.5) to each sample's reward.")
    weight: float = Field(1.0, ge=0, description="Scale of the length reward.")
    warmup_iterations: int = Field(0, ge=0, description="Iterations before it switches on (K1.5 keeps it off early).")


class TemperatureScheduleConfig(K2Config):
    """Sampling-temperature decay: high early (explore), lower later (exploit)."""

    kind: Literal["constant", "linear", "cosine", "exponential"] = Field("linear", description="Shape of the decay.")
    start: float = Field(1.0, gt=0, description="Temperature at iteration 0.")
    end: float = Field(0.7, gt=0, description="Temperature from `decay_iterations` on.")
    decay_iterations: int = Field(100, gt=0, description="Iterations over which it goes from start to end.")


class TemperatureConfig(K2Config):
    """A default schedule plus per-task-type ones."""

    default: TemperatureScheduleConfig = Field(
        default_factory=TemperatureScheduleConfig, description="Schedule of task types not listed."
    )
    per_task_type: dict[str, TemperatureScheduleConfig] = Field(
        default_factory=dict, description="Schedule per task type."
    )

    def schedule_for(self, task_type: str) -> TemperatureScheduleConfig:
        """The schedule of a task type."""
        return self.per_task_type.get(task_type, self.default)


class PromptSamplingConfig(K2Config):
    """How prompts are drawn from a task pool: uniform, prioritized by failure, curriculum by difficulty."""

    strategy: Literal["uniform", "prioritized", "curriculum"] = Field("prioritized", description="Sampling strategy.")
    min_weight: float = Field(
        0.05,
        gt=0,
        le=1,
        description="Prioritized: floor of a task's weight (1 - success rate), so solved tasks still come back.",
    )
    prior_success: float = Field(
        0.5, ge=0, le=1, description="Prioritized: success rate assumed for a task never tried."
    )
    curriculum_start: float = Field(
        0.3, gt=0, le=1, description="Curriculum: share of the pool (easiest first) open at iteration 0."
    )
    curriculum_iterations: int = Field(50, gt=0, description="Curriculum: iterations until the whole pool is open.")


class ISCorrectionConfig(K2Config):
    """Importance-sampling correction for the gap between the rollout engine (behaviour policy mu) and pi_old.

    Token weights w_t = min(pi_old(y_t) / mu(y_t), cap) enter the K1.5 log-ratio (docs/RL.md). The sequence mask has
    its own thresholds: an episode is dropped when the per-token geometric mean of pi_old / mu leaves
    [mask_low, mask_high] and its whole ratio also leaves [1 / mask_product_band, mask_product_band]."""

    renamed_fields = {
        "sequence_ratio": "mask_low / mask_high (the mask always tests the per-token geometric mean, with "
        "mask_product_band for short responses)",
    }

    enabled: bool = Field(
        False,
        description="Weight each token by its truncated ratio and mask far-off episodes. Off by default: an fp32 "
        "engine on CPU matches the trainer to ~1e-6; turn it on for bf16/fp8 engines (GPU) and partial rollouts.",
    )
    cap: float = Field(
        2.0, gt=1, description="C: each token's ratio pi_old / mu is truncated at C (the mask has its own thresholds)."
    )
    sequence_mask: bool = Field(True, description="Drop episodes whose ratio is off (false: token weights only).")
    mask_low: float = Field(
        0.999,
        gt=0,
        lt=1,
        description="Lower bound on an episode's per-token geometric mean of pi_old / mu (verl's geometric-mean band; "
        "bf16 noise keeps long responses within 1e-3 of 1, a stretch of mismatched tokens does not).",
    )
    mask_high: float = Field(1.001, gt=1, description="Upper bound on the per-token geometric mean of pi_old / mu.")
    mask_product_band: float = Field(
        2.0,
        ge=1,
        description="B: an episode whose whole ratio pi_old(y|x) / mu(y|x) lies in [1/B, B] is kept whatever its "
        "geometric mean (short responses, whose per-token mean is noisy); 1 turns this allowance off.",
    )
    warn_masked_share: float = Field(
        0.05,
        ge=0,
        le=1,
        description="Log a warning when the mask drops more than this share of a step's episodes (engine and "
        "trainer disagree: check dtype, temperature, routing replay, stale weights).",
    )
