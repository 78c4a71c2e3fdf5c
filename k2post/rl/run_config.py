"""The `kind: rl` run config: policy, environment mix, rollout, loss, trainer, scale, loop.

    cfg = load_run_config("configs/rl_demo.yaml", ["train.iterations=4"], expected_kind="rl")

Every field is documented in docs/RL.md (and by `k2post config show configs/rl_demo.yaml`).
Cross-field checks run here, so a bad config fails before Ray or any actor starts.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from k2post.config.base import K2Config
from k2post.config.registry import register_run_config
from k2post.envs.mix import EnvEntryConfig
from k2post.models.config import ModelConfig
from k2post.quant.config import QATConfig
from k2post.optim.config import OptimConfig
from k2post.rl.config import (
    BudgetConfig,
    ISCorrectionConfig,
    LengthPenaltyConfig,
    PromptSamplingConfig,
    TemperatureConfig,
)
from k2post.rollout.config import AgenticRolloutConfig, VLLMEngineConfig, check_routing_capture
from k2post.train.config import MOVED_TRAIN_KEYS, CheckpointConfig, LRScheduleConfig
from k2post.train.lora_config import LoRAConfig


class RLRolloutConfig(K2Config):
    """How prompts become samples: the vLLM engines, K samples per prompt, partial rollout."""

    replicas: int = Field(1, ge=1, description="Rollout actors (vLLM engines); each takes a share of the episodes.")
    prompts_per_iteration: int = Field(8, ge=1, description="Prompts drawn from the mix per iteration.")
    samples_per_prompt: int = Field(4, ge=2, description="K: samples per prompt (the K1.5 mean baseline needs K >= 2).")
    top_p: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Nucleus sampling mass of every rollout; RL needs 1.0 (the trainer's pi_old and pi_theta are "
        "softmax(logits / T) over the whole vocabulary, the distribution sampled at top_p 1).",
    )

    @field_validator("top_p")
    @classmethod
    def _full_vocabulary(cls, value: float) -> float:
        if value < 1:
            raise ValueError(
                f"rollout.top_p {value}: RL trains softmax(logits / T) over the whole vocabulary, and a nucleus cut "
                "cannot be reproduced exactly by the trainer (tokens at its edge flip under numeric noise); set "
                "rollout.top_p: 1.0 and lower the temperature instead"
            )
        return value

    engine: VLLMEngineConfig = Field(
        default_factory=lambda: VLLMEngineConfig(dtype="float32", max_model_len=2048, max_num_seqs=64),
        description="The vLLM engine of each rollout actor.",
    )
    agentic: AgenticRolloutConfig = Field(
        default_factory=AgenticRolloutConfig,
        description="Turn limits, observation cut and partial rollout (iteration_token_budget) of the episodes.",
    )
    sleep_during_training: bool = Field(
        True,
        description="Put the engines to sleep while the trainer steps (frees the KV cache) and wake them for the push.",
    )


class RLLossConfig(K2Config):
    """The K1.5 objective plus the PTX term, and how many optimizer steps one iteration takes."""

    tau: float = Field(
        0.1, gt=0, description="K1.5 tau: weight of the log-ratio inside the square (larger = more conservative)."
    )
    groups_per_step: int = Field(8, ge=1, description="Complete prompt groups (K samples each) in one optimizer step.")
    max_steps_per_iteration: int = Field(
        1, ge=1, description="Most optimizer steps per iteration; ready groups beyond that wait for the next iteration."
    )
    drop_uniform_groups: bool = Field(
        False,
        description="Train only on groups whose shaped rewards differ (DAPO's dynamic sampling): a group of equal "
        "rewards has zero advantage everywhere and would only add the tau term. Its success still updates the prompt "
        "sampler. Draw more prompts (rollout.prompts_per_iteration) to keep groups_per_step x max_steps_per_iteration "
        "groups a step.",
    )
    ptx_coef: float = Field(0.0, ge=0, description="alpha_ptx: weight of the PTX NLL on curated data (0: off).")
    ptx_data: str | None = Field(
        None, description="HF dataset dir of chat rows for the PTX loss (what `k2post synth` writes)."
    )
    ptx_rows_per_step: int = Field(2, ge=1, description="Chat rows in each optimizer step's PTX batch.")
    ptx_domains: list[str] = Field(
        default_factory=list,
        description="Keep only PTX rows whose `domain` column is one of these (e.g. [gym:math]); empty: every row. "
        "Rows are shuffled with the run's seed either way.",
    )
    micro_batch_size: int = Field(
        8,
        ge=1,
        description="Sequences per trainer forward pass; groups_per_step * K / world_size / micro_batch_size "
        "forwards per step.",
    )
    is_correction: ISCorrectionConfig = Field(
        default_factory=ISCorrectionConfig,
        description="Truncated importance sampling against the engine's behaviour log-probs (docs/RL.md).",
    )

    @model_validator(mode="after")
    def _ptx_needs_data(self) -> "RLLossConfig":
        if self.ptx_coef > 0 and not self.ptx_data:
            raise ValueError(
                "ptx_coef > 0 needs ptx_data (an HF dataset dir of chat rows): set loss.ptx_data or ptx_coef: 0"
            )
        return self


class Zero3Config(K2Config):
    """How much of the model a ZeRO-3 rank gathers at once (DeepSpeed's stage3_* settings; docs/SCALING.md)."""

    prefetch_bucket_numel: int = Field(
        50_000_000,
        ge=0,
        description="Elements of upcoming layers' parameters gathered ahead of use (DeepSpeed "
        "stage3_prefetch_bucket_size). Lower: less memory, less overlap of gathers with compute.",
    )
    max_live_numel: int = Field(
        1_000_000_000,
        ge=1,
        description="Most gathered parameter elements alive at once before released (stage3_max_live_parameters).",
    )
    persistence_threshold_numel: int = Field(
        100_000,
        ge=0,
        description="Parameters with fewer elements stay whole on every rank, never partitioned "
        "(stage3_param_persistence_threshold): norms and biases, where a gather costs more than it saves.",
    )
    max_reuse_distance: int = Field(
        1_000_000_000,
        ge=0,
        description="A gathered parameter used again within this many elements of other parameters is kept "
        "(stage3_max_reuse_distance); 0 releases each one after its layer.",
    )
    reduce_bucket_numel: int = Field(
        500_000_000,
        ge=1,
        description="Gradient elements reduce-scattered per bucket (reduce_bucket_size). ZeRO-3 keeps a buffer of "
        "this many elements and fills up to the model's size of it during backward: lower it when the model is "
        "large next to a rank's memory.",
    )


class RLTrainerConfig(K2Config):
    """The trainer ranks: Ray actors running DeepSpeed with ZeroMuonClip."""

    world_size: int = Field(1, ge=1, description="Trainer ranks (data parallel; ZeRO shards over them).")
    zero_stage: Literal[0, 1, 2, 3] = Field(
        1,
        description="ZeRO stage of the trainer: 0 none, 1 optimizer state, 2 + gradients, 3 + parameters sharded "
        "over the ranks (the weight push then gathers one parameter at a time, bucket by bucket: docs/SCALING.md).",
    )
    zero3: Zero3Config = Field(
        default_factory=Zero3Config, description="ZeRO-3 gather limits (used when zero_stage is 3)."
    )
    dist_backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="torch.distributed backend; auto: nccl with CUDA, else gloo."
    )
    offload_during_rollout: bool = Field(
        True, description="On a GPU, move params and optimizer state to DRAM while the engines generate (no-op on CPU)."
    )
    bucket_mb: int = Field(64, ge=1, description="Checkpoint-engine bucket size (MiB) of the weight push.")
    verify_push_every: int = Field(
        10,
        ge=0,
        description="Verify the first weight push and then every N-th: the engine reports a digest of every tensor "
        "it loaded and that every parameter was written; a mismatch with the trainer's stops the run naming the "
        "tensor (docs/CHECKPOINT_ENGINE.md). 0: never.",
    )
    torch_threads: int | None = Field(
        None,
        ge=1,
        description="Intra-op threads of each rank (null: the CPUs of its placement bundle; colocated actors take "
        "turns, so the trainer may use them all while the engines sleep).",
    )


class RLTrainLoopConfig(K2Config):
    """Iterations, evaluation, logging (the lr schedule and checkpoints: `schedule`, `checkpoint`)."""

    renamed_fields = MOVED_TRAIN_KEYS

    iterations: int = Field(20, ge=1, description="RL iterations (rollout + train + push).")
    prompt_pool_per_env: int = Field(
        256, ge=1, description="Train tasks drawn from each environment (new seeds) to sample prompts from."
    )
    eval_every: int = Field(5, ge=0, description="Held-out accuracy every N iterations (0: only before and after).")
    eval_at_start: bool = Field(True, description="Also measure held-out accuracy before the first iteration.")
    eval_chunk: int = Field(
        16,
        ge=1,
        description="Held-out rewards scored per chunk; after each chunk the eval stops with one line when more than "
        "reward.max_reward_error_fraction of the rewards so far are scorer errors.",
    )
    eval_tasks_per_env: int = Field(32, ge=1, description="Held-out tasks per environment at each in-loop eval.")
    eval_split: Literal["dev", "test"] = Field(
        "dev",
        description="Split of the in-loop eval: dev (default; its curve may guide settings) or test (never tune on it: "
        "the report is `k2post eval --split test`).",
    )
    stop_at_iteration: int | None = Field(
        None, gt=0, description="End this invocation after this iteration (checkpointed); resume to continue."
    )
    plots: bool = Field(True, description="Write PNG plots of the metrics into run_dir/plots at the end.")
    log_every: int = Field(1, ge=1, description="Print a progress line every N iterations.")


class RLRayConfig(K2Config):
    """Where the actors run."""

    address: str | None = Field(
        None, description="Ray cluster address; null: start an embedded Ray (or join the job's cluster)."
    )
    num_cpus: int | None = Field(None, ge=1, description="CPUs of the embedded Ray (null: all).")
    temp_dir: str | None = Field(
        None, description="Temp dir of the embedded Ray (null: Ray's default; a relative path is made absolute)."
    )
    cpus_per_bundle: float = Field(
        1.0, gt=0, description="CPUs of each placement-group bundle (one trainer rank + its rollout actor)."
    )
    gpus_per_bundle: float | None = Field(
        None,
        ge=0,
        description="GPUs of each bundle, shared by its trainer rank and rollout actor (each asks for half: Ray "
        "shows an actor only the GPUs it asked for). null: 1 when the driver sees CUDA, else 0.",
    )
    actor_restarts: int = Field(
        2, ge=0, description="Times a dead rollout actor is restarted and re-synced before the run fails."
    )
    start_together: bool | None = Field(
        None,
        description="Build the trainer ranks and the rollout engines at the same time (faster start). null: together "
        "when the controller sees no CUDA device; on a GPU the trainers load first, so vLLM's memory profiling at "
        "start-up sees them.",
    )

    @field_validator("temp_dir")
    @classmethod
    def _absolute(cls, path: str | None) -> str | None:
        return None if path is None else os.path.abspath(path)  # Ray refuses relative temp dirs


class RLRewardConfig(K2Config):
    """Reward computation in isolated worker processes."""

    workers: int = Field(1, ge=1, description="RewardPool worker processes.")
    timeout_s: float = Field(
        10.0, gt=0, description="Per-response scoring timeout; a hang gives the environment's minimum reward."
    )
    success_threshold: float = Field(
        0.5, description="A reward at or above this counts as a success (accuracy, prioritized sampling)."
    )
    max_reward_error_fraction: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="Stop the run with one line when more than this share of an iteration's rewards are scorer "
        "errors (raised, timed out, outside reward_range); every iteration with errors logs the first texts "
        "(1.0: never stop).",
    )


class RLCriticConfig(K2Config):
    """The critic's closed loop: on-policy verifier-labelled pairs feed the `critic_calibration` environment."""

    harvest_pairs_per_group: int = Field(
        2,
        ge=0,
        description="Pairs (correct, wrong) taken from each finished group of a calibration source with mixed rewards "
        "(0: off).",
    )
    max_harvested_tasks: int = Field(
        2000, ge=0, description="Most judge tasks added to critic_calibration's train pool during a run."
    )


@register_run_config
class RLConfig(K2Config):
    """Colocated RL: K1.5 + PTX loss with MuonClip, vLLM rollouts, checkpoint-engine pushes (docs/RL.md)."""

    renamed_fields = {"sampling": "prompt_sampling"}

    kind: Literal["rl"] = Field("rl", description="Run config kind; must be 'rl'.")
    run_dir: str = Field(
        "runs/rl", description="Outputs: config.yaml, metrics.jsonl, tb/, plots/, checkpoints/iter-N, final/."
    )
    resume: bool | Literal["auto"] = Field(
        False,
        description="Continue from the newest checkpoint in run_dir (false: run_dir must not hold a run; auto: "
        "continue when run_dir holds a run, else start fresh, so resubmitting the same command continues it).",
    )
    seed: int = Field(0, description="Seed of task pools, prompt sampling, rollout sampling and torch.")
    model: ModelConfig = Field(
        default_factory=ModelConfig, description="The starting policy (e.g. the SFT run's final/ dir)."
    )
    envs: list[EnvEntryConfig] = Field(
        default_factory=lambda: [EnvEntryConfig()], description="The environment mix (name, weight, config)."
    )
    rollout: RLRolloutConfig = Field(default_factory=RLRolloutConfig, description="Rollout actors and sampling.")
    loss: RLLossConfig = Field(default_factory=RLLossConfig, description="K1.5 + PTX objective.")
    optim: OptimConfig = Field(
        default_factory=lambda: OptimConfig(lr=2e-4, weight_decay=0.0), description="MuonClip settings (constant lr)."
    )
    budget: BudgetConfig = Field(
        default_factory=BudgetConfig, description="Per-task-type token budgets and the truncation penalty."
    )
    length_penalty: LengthPenaltyConfig = Field(
        default_factory=LengthPenaltyConfig, description="The optional K1.5 length reward."
    )
    temperature: TemperatureConfig = Field(
        default_factory=TemperatureConfig, description="Sampling-temperature decay per task type."
    )
    prompt_sampling: PromptSamplingConfig = Field(
        default_factory=PromptSamplingConfig,
        description="How prompts are drawn from the pool (token sampling: rollout).",
    )
    trainer: RLTrainerConfig = Field(default_factory=RLTrainerConfig, description="Trainer ranks.")
    train: RLTrainLoopConfig = Field(default_factory=RLTrainLoopConfig, description="The loop.")
    schedule: LRScheduleConfig = Field(
        default_factory=lambda: LRScheduleConfig(kind="constant"),
        description="optim.lr over the run's optimizer steps (iterations x loss.max_steps_per_iteration); cosine "
        "decay makes late RL steps drift less.",
    )
    checkpoint: CheckpointConfig = Field(
        default_factory=lambda: CheckpointConfig(every=5), description="Resumable checkpoints every N iterations."
    )
    reward: RLRewardConfig = Field(default_factory=RLRewardConfig, description="Reward workers.")
    ray: RLRayConfig = Field(default_factory=RLRayConfig, description="Ray placement.")
    critic: RLCriticConfig = Field(
        default_factory=RLCriticConfig, description="The critic's closed loop (critic_calibration in the mix)."
    )
    qat: QATConfig = Field(
        default_factory=QATConfig,
        description="INT4 weight-only QAT (K2 Thinking): the trainer's forward uses the INT4 round trip of the target "
        "weights and the engines are pushed exactly those values (docs/QAT.md).",
    )
    lora: LoRAConfig = Field(
        default_factory=LoRAConfig,
        description="LoRA adapters (peft) instead of full-weight training; the engines get the merged weights "
        "(docs/RL.md, 'LoRA').",
    )
    routing_replay: bool = Field(
        False,
        description="MoE models: the engines record each token's experts and the trainer's pi_old and loss forwards "
        "use them (turns rollout.engine.record_routing on; the engines then run without prefix caching).",
    )

    @model_validator(mode="after")
    def _replay_records(self) -> "RLConfig":
        check_routing_capture(self.routing_replay, self.rollout.engine.enforce_eager)
        if self.routing_replay and not self.rollout.engine.record_routing:
            self.rollout.engine.record_routing = True  # replay needs what the engines record
        engine = self.rollout.engine
        if self.lora.enabled and self.lora.push == "adapter" and (engine.lora_max_rank or 0) < self.lora.rank:
            engine.lora_max_rank = self.lora.rank  # adapter pushes need engines built with LoRA support
        return self

    @model_validator(mode="after")
    def _check(self) -> "RLConfig":
        names = [entry.name for entry in self.envs]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"envs must list each environment once, got {names}")
        if self.schedule.warmup_steps >= self.total_optimizer_steps():
            raise ValueError(
                f"schedule.warmup_steps ({self.schedule.warmup_steps}) must be < the run's optimizer steps "
                f"({self.total_optimizer_steps()} = iterations x loss.max_steps_per_iteration): lower it"
            )
        if self.model.dtype != "float32":
            raise ValueError("model.dtype must be float32 (the trainer keeps fp32 weights)")
        if self.train.stop_at_iteration is not None and self.train.stop_at_iteration >= self.train.iterations:
            raise ValueError(
                f"train.stop_at_iteration ({self.train.stop_at_iteration}) must be < "
                f"train.iterations ({self.train.iterations})"
            )
        if self.rollout.replicas > self.trainer.world_size:
            raise ValueError(
                f"rollout.replicas ({self.rollout.replicas}) > trainer.world_size ({self.trainer.world_size}): "
                "each trainer rank's weight sender serves one rollout actor colocated with it; raise world_size or "
                "lower replicas"
            )
        per_step = self.loss.groups_per_step * self.rollout.samples_per_prompt
        per_forward = self.trainer.world_size * self.loss.micro_batch_size
        if per_step % per_forward:
            raise ValueError(
                f"loss.groups_per_step * rollout.samples_per_prompt ({per_step} sequences per step) must be a "
                f"multiple of trainer.world_size * loss.micro_batch_size ({per_forward}): change groups_per_step or "
                "micro_batch_size"
            )
        longest = max(self.budget.max_tokens.values(), default=self.budget.default_max_tokens)
        if longest > self.rollout.agentic.max_episode_tokens:
            raise ValueError(
                f"a budget ({longest} tokens) exceeds rollout.agentic.max_episode_tokens "
                f"({self.rollout.agentic.max_episode_tokens}): raise max_episode_tokens or lower the budget"
            )
        self._check_context()
        self._check_lora()
        return self

    def _check_lora(self) -> None:
        """LoRA trains adapters on a frozen, replicated base: the parts that would change the base are refused."""
        if not self.lora.enabled:
            return
        clash = {
            "qat.enabled": self.qat.enabled,  # the engines would need the INT4 round trip of base + adapter
            "optim.qk_clip.enabled": self.optim.qk_clip.enabled,  # QK-Clip rescales W_q / W_k: frozen under LoRA
            "trainer.zero_stage 3": self.trainer.zero_stage == 3,  # merged pushes need the whole base on each rank
        }
        on = [name for name, value in clash.items() if value]
        if on:
            raise ValueError(
                f"lora.enabled with {', '.join(on)}: LoRA freezes and replicates the base weights, which these "
                "change or shard; turn them off (qat.enabled: false, optim.qk_clip.enabled: false, zero_stage <= 2)"
            )
        forced = [p for p in self.optim.muon_patterns if "lora" in p]
        if forced:
            raise ValueError(f"optim.muon_patterns {forced} would send LoRA adapters to Muon: they train with AdamW")

    def _check_context(self) -> None:
        """Context elision must start before the engine's context runs out."""
        agentic, engine_len = self.rollout.agentic, self.rollout.engine.max_model_len
        if agentic.context.enabled and agentic.context.budget_tokens + agentic.max_turn_tokens > engine_len:
            raise ValueError(
                f"rollout.agentic.context.budget_tokens ({agentic.context.budget_tokens}) + max_turn_tokens "
                f"({agentic.max_turn_tokens}) > rollout.engine.max_model_len ({engine_len}): episodes would hit the "
                "context limit before eliding; lower context.budget_tokens or raise max_model_len"
            )

    def env_configs(self) -> dict[str, dict[str, Any]]:
        """name -> validated environment config dict (what the actors and reward workers build from)."""
        return {entry.name: dict(entry.config) for entry in self.envs}

    def trainer_threads(self) -> int:
        """torch intra-op threads of each trainer rank."""
        return self.trainer.torch_threads or max(1, int(self.ray.cpus_per_bundle))

    def total_optimizer_steps(self) -> int:
        """The most optimizer steps the run takes (the lr schedule's length)."""
        return self.train.iterations * self.loss.max_steps_per_iteration

    def gradient_accumulation_steps(self) -> int:
        """Forwards per optimizer step on each rank."""
        per_step = self.loss.groups_per_step * self.rollout.samples_per_prompt
        return per_step // (self.trainer.world_size * self.loss.micro_batch_size)
