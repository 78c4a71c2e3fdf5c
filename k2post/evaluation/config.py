"""Config of a held-out evaluation (`k2post eval`): which model, which environments, how many tasks.

    cfg = EvalConfig(model_path="runs/rl_demo/final", envs=[EnvEntryConfig(name="math")], n=64, seed=1)

Built by the CLI from its flags (docs/EVAL.md), or directly by the demo and the benchmarks.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from k2post.config.base import K2Config
from k2post.envs.mix import EnvEntryConfig
from k2post.rl.config import BudgetConfig
from k2post.rollout.config import AgenticRolloutConfig, VLLMEngineConfig


class EvalConfig(K2Config):
    """Greedy (or sampled, avg@k) accuracy per environment on freshly generated held-out tasks."""

    model_path: str = Field(
        "runs/rl_demo/final", description="HF model dir to evaluate (a run dir is resolved to one by the CLI)."
    )
    envs: list[EnvEntryConfig] = Field(
        default_factory=lambda: [EnvEntryConfig()],
        min_length=1,
        description="Environments to evaluate on (name + config; weight unused).",
    )
    n: int = Field(64, ge=1, description="Held-out tasks per environment (fewer when its split is smaller).")
    seed: int = Field(0, description="Seed of the task draw: the split's tasks for this seed, shuffled and cut to n.")
    split: Literal["test", "dev", "shifted", "train"] = Field(
        "test",
        description="Split to draw tasks from: test (the report), dev (choosing settings), shifted (generalization "
        "to a held-out distribution shift), train (sanity checks); see k2post.envs.splits.",
    )
    samples_per_task: int = Field(1, ge=1, description="Episodes per task; accuracy is their mean (avg@k).")
    temperature: float = Field(0.0, ge=0, description="Sampling temperature (0: greedy; needs samples_per_task 1).")
    budget: BudgetConfig = Field(
        default_factory=lambda: BudgetConfig(penalty="none"),
        description="Token budget per task type (a truncated episode is scored as is unless penalty is set).",
    )
    success_threshold: float = Field(0.5, description="A reward at or above this counts as solved.")
    engine: VLLMEngineConfig = Field(
        default_factory=lambda: VLLMEngineConfig(dtype="float32", max_model_len=2048, max_num_seqs=64),
        description="The vLLM engine (in this process).",
    )
    agentic: AgenticRolloutConfig = Field(
        default_factory=lambda: AgenticRolloutConfig(max_episode_tokens=1024),
        description="Turn limits of multi-turn episodes (iteration_token_budget is ignored: episodes run to the end).",
    )
    reward_workers: int = Field(1, ge=1, description="Isolated reward worker processes.")
    reward_timeout_s: float = Field(
        10.0, gt=0, description="Per-episode scoring timeout (a hang scores the env's minimum)."
    )
    max_reward_error_fraction: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="Fail (after writing the report) when more than this share of the rewards are errors: a "
        "scorer that raises, times out or leaves reward_range (1.0: never).",
    )
    report_path: str | None = Field(None, description="Where the JSON report goes (null: not written).")

    @model_validator(mode="after")
    def _check(self) -> "EvalConfig":
        names = [entry.name for entry in self.envs]
        if len(set(names)) != len(names):
            raise ValueError(f"envs must list each environment once, got {names}")
        if self.temperature == 0 and self.samples_per_task > 1:
            raise ValueError(
                "samples_per_task > 1 with temperature 0 repeats the same greedy episode: "
                "set temperature > 0 or samples_per_task 1"
            )
        longest = max([*self.budget.max_tokens.values(), self.budget.default_max_tokens])
        if longest > self.agentic.max_episode_tokens:
            raise ValueError(
                f"a budget ({longest} tokens) exceeds agentic.max_episode_tokens ({self.agentic.max_episode_tokens}): "
                "raise it or lower the budget"
            )
        return self

    def env_configs(self) -> dict[str, dict]:
        """name -> validated environment config dict."""
        return {entry.name: dict(entry.config) for entry in self.envs}
