"""Run configs: what each `k2post <command> CONFIG` takes. Each composes component configs.

Registered explicitly by `kind`; `k2post config show FILE` picks the class from the YAML's
`kind` field.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from k2post.config.base import K2Config
from k2post.config.registry import register_run_config
from k2post.models.config import ModelConfig
from k2post.rollout.config import SamplingConfig, VLLMEngineConfig

DEFAULT_DEMO_PROMPTS = [
    "What is 17 + 25?",
    "Name three colors.",
    "Write a haiku about the sea.",
    "Call the weather tool for Paris.",
]


@register_run_config
class DemoConfig(K2Config):
    """End-to-end smoke run: build the tiny model, chat with it through vLLM, check vs transformers."""

    kind: Literal["demo"] = Field("demo", description="Run config kind; must be 'demo'.")
    run_dir: str = Field("runs/demo", description="Directory for outputs (generations.jsonl, summary.json).")
    model: ModelConfig = Field(default_factory=ModelConfig, description="Which model to load or build.")
    engine: VLLMEngineConfig = Field(default_factory=VLLMEngineConfig, description="vLLM engine settings.")
    sampling: SamplingConfig = Field(
        default_factory=lambda: SamplingConfig(temperature=0.0, max_tokens=32),
        description="Sampling for the demo generations (greedy by default, so vLLM and transformers can be compared).",
    )
    prompts: list[str] = Field(
        default_factory=lambda: list(DEFAULT_DEMO_PROMPTS), min_length=1, description="User messages to answer."
    )
    check_against_transformers: bool = Field(
        True,
        description="Also greedy-decode with transformers and report whether outputs are identical "
        "(needs temperature 0).",
    )

    @model_validator(mode="after")
    def _comparison_needs_greedy(self) -> "DemoConfig":
        if self.check_against_transformers and self.sampling.temperature != 0:
            raise ValueError(
                "check_against_transformers needs greedy decoding: set sampling.temperature: 0 "
                "or check_against_transformers: false"
            )
        return self


# Run configs that live next to their components register when imported here.
from k2post.synth import config as _synth_config  # noqa: E402,F401
from k2post.sft import config as _sft_config  # noqa: E402,F401
from k2post.rl import run_config as _rl_config  # noqa: E402,F401
from k2post.rephrase import config as _rephrase_config  # noqa: E402,F401
from k2post.judging import faithfulness_config as _judge_config  # noqa: E402,F401


@register_run_config
class RecipeConfig(K2Config):
    """The whole recipe end to end (`make demo`): model -> synth -> SFT -> held-out eval -> RL -> held-out eval."""

    kind: Literal["recipe"] = Field("recipe", description="Run config kind; must be 'recipe'.")
    run_dir: str = Field(
        "runs/demo", description="Everything goes here: model/, synth/, sft/, rl/, eval/, logs/, report."
    )
    model: ModelConfig = Field(
        default_factory=lambda: ModelConfig(flavor="tiny-qwen2", path="{run_dir}/model"),
        description="The starting model (built from `flavor` when `path` does not exist); `{run_dir}` in `path` is "
        "replaced by run_dir, so each seed's run builds its own init.",
    )
    synth: str = Field(
        "configs/synth_demo.yaml",
        description="`kind: synth` config of the SFT data (its out_dir is set to run_dir/synth).",
    )
    sft: str = Field(
        "configs/sft_demo.yaml",
        description="`kind: sft` config of the warm start (model, data and run_dir are set here).",
    )
    rl: str = Field(
        "configs/rl_demo.yaml",
        description="`kind: rl` config (model and run_dir are set here); its envs are the ones evaluated.",
    )
    synth_overrides: list[str] = Field(
        default_factory=list, description="Extra key.path=value overrides of the synth stage."
    )
    sft_overrides: list[str] = Field(
        default_factory=list, description="Extra key.path=value overrides of the SFT stage."
    )
    rl_overrides: list[str] = Field(default_factory=list, description="Extra key.path=value overrides of the RL stage.")
    seed: int | None = Field(
        None,
        description="One seed for every stage (model init, synth tasks, SFT data order and torch, RL pools and "
        "sampling): `seed=1` reruns the whole recipe as another seed. null: each stage config's own seed (model.seed "
        "for the model).",
    )
    eval_n: int = Field(
        200, ge=1, description="Held-out tasks per environment (test split and shifted sets), before and after RL."
    )
    eval_seed: int = Field(1, description="Seed of the held-out draw (the RL run's in-loop eval uses the RL seed).")
    fresh: bool = Field(
        False, description="Redo every stage (false: a stage whose output is complete is skipped, a cut one resumed)."
    )

    @model_validator(mode="after")
    def _stages_are_valid(self) -> "RecipeConfig":
        from k2post.config.registry import load_run_config

        for kind, path, overrides in (
            ("synth", self.synth, self.synth_overrides),
            ("sft", self.sft, self.sft_overrides),
            ("rl", self.rl, self.rl_overrides),
        ):
            load_run_config(path, overrides, expected_kind=kind)  # a bad stage config fails here, before any stage runs
        return self
