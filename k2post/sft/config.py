"""Configs of the SFT run: data, training loop, DeepSpeed engine, and the `kind: sft` run config.

    cfg = load_run_config("configs/sft_tool_use.yaml", ["train.max_steps=50"], expected_kind="sft")

Every field is documented in docs/SFT.md (and by `k2post config show configs/sft_tool_use.yaml`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from k2post.config.base import K2Config
from k2post.quant.config import QATConfig
from k2post.config.registry import register_run_config
from k2post.models.config import ModelConfig
from k2post.optim.config import OptimConfig
from k2post.train.config import MOVED_TRAIN_KEYS, CheckpointConfig, LRScheduleConfig


class SFTDataConfig(K2Config):
    """Where the chat rows come from and how they become training examples."""

    path: str = Field(
        "runs/synth_tool_use/dataset",
        description="An HF dataset dir written with `save_to_disk` (what `k2post synth` writes), a JSONL file, or a "
        "dir of JSONL files; rows in k2post's columns or the OpenAI/TRL conversational format (docs/SFT.md).",
    )
    columns: dict[str, str] = Field(
        default_factory=dict,
        description="The dataset's names for k2post's columns (id, messages, tools, domain, metadata, verdict), e.g. "
        "{messages: conversations}; unmapped ones keep their names. Rows without an id get one from their content.",
    )
    max_seq_len: int = Field(
        2048,
        gt=1,
        description="Tokens per packed row. A rendered dialogue longer than this is a bad row (never truncated).",
    )
    packing: bool = Field(
        True,
        description="Pack several dialogues into one row (block-causal attention, positions restart per dialogue); "
        "false: one dialogue per row.",
    )
    eval_fraction: float = Field(
        0.05,
        ge=0,
        lt=1,
        description="Share of rows held out for eval loss, chosen by a hash of the row id (deterministic).",
    )
    split_salt: str = Field(
        "k2post-sft", description="Salt of the id hash that picks the held-out rows (change it for another split)."
    )
    bad_rows: Literal["skip", "error"] = Field(
        "skip",
        description="A row that breaks the schema or the template: skip it (counted and listed in data_report.json) "
        "or stop with an error naming the row.",
    )
    max_bad_fraction: float = Field(
        0.5, ge=0, le=1, description="With bad_rows: skip, fail anyway when more than this share of the rows is bad."
    )
    tool_call_ids: Literal["require_k2", "renumber"] = Field(
        "renumber",
        description="Tool call ids are rewritten to K2's functions.NAME:IDX (IDX counting calls from 0), tool results "
        "re-pointed at them (renumber: OpenAI-style ids like call_abc123 work), or must already read so "
        "(require_k2: else a bad row).",
    )
    limit: int | None = Field(None, gt=0, description="Read only the first N rows (null: all).")
    reasoning_history: Literal["split", "last_exchange"] = Field(
        "split",
        description="A dialogue whose earlier exchanges carry reasoning (K2-Thinking's template hides it, and leaves "
        "it untrained, once a later assistant message without tool calls follows): split it into one example per "
        "such exchange, each ending at that exchange's answer, so every reasoning is trained once in the context the "
        "policy sees (split); or keep one example that trains only the last exchange (last_exchange). Instruct "
        "models render no reasoning: nothing to split.",
    )


class SFTTrainConfig(K2Config):
    """The training loop: steps, batch shape, eval, logging (the lr schedule and checkpoints: `schedule`,
    `checkpoint`)."""

    renamed_fields = MOVED_TRAIN_KEYS

    max_steps: int | None = Field(
        None, gt=0, description="Optimizer steps; null: `epochs` passes over the packed train rows (rounded up)."
    )
    epochs: int = Field(1, ge=1, description="Passes over the train rows when max_steps is null.")
    micro_batch_size: int = Field(1, ge=1, description="Packed rows per forward pass (per rank).")
    gradient_accumulation_steps: int = Field(1, ge=1, description="Micro-batches per optimizer step (per rank).")
    eval_every: int = Field(
        50, ge=0, description="Eval loss on the held-out rows every N steps (0: only at start and end)."
    )
    eval_at_start: bool = Field(True, description="Also measure eval loss before the first step (step 0).")
    eval_batch_size: int = Field(4, ge=1, description="Packed held-out rows per eval forward pass.")
    log_every: int = Field(10, ge=1, description="Print a progress line every N steps (metrics.jsonl gets every step).")
    progress_bar: bool = Field(True, description="Show a live progress bar when stdout is a terminal.")
    seed: int = Field(0, description="Seed of the per-epoch shuffle of the train dialogues (and of torch's RNG).")
    stop_at_step: int | None = Field(
        None,
        gt=0,
        description="End this invocation after this step (a checkpoint is written, no final model) - for time-limited "
        "jobs; continue with `k2post sft --resume RUN_DIR`. null: run to the end.",
    )

    @model_validator(mode="after")
    def _steps_are_consistent(self) -> "SFTTrainConfig":
        if self.max_steps is not None and self.stop_at_step is not None and self.stop_at_step >= self.max_steps:
            raise ValueError(
                f"stop_at_step ({self.stop_at_step}) must be < max_steps ({self.max_steps}): drop stop_at_step "
                "to run to the end"
            )
        return self


class SFTDeepSpeedConfig(K2Config):
    """The DeepSpeed engine around the model; the optimizer is always MuonClip (ZeroMuonClip)."""

    zero_stage: Literal[0, 1, 2, 3] = Field(
        2, description="ZeRO stage: 0 none, 1 optimizer state, 2 + gradients, 3 + parameters sharded over ranks."
    )
    precision: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="Compute dtype. bf16 keeps fp32 master weights in the ZeRO optimizer (needs zero_stage >= 1).",
    )
    dist_backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="torch.distributed backend; auto: nccl when CUDA is visible, else gloo."
    )
    extra: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra DeepSpeed config keys merged over the generated ones (e.g. zero_optimization tuning); "
        "no 'optimizer' or 'scheduler' section (MuonClip and the lr schedule are k2post's).",
    )

    @model_validator(mode="after")
    def _check(self) -> "SFTDeepSpeedConfig":
        if self.precision == "bf16" and self.zero_stage == 0:
            raise ValueError(
                "precision bf16 needs zero_stage >= 1 (ZeroMuonClip keeps the fp32 masters there): set zero_stage: 1"
            )
        clash = sorted({"optimizer", "scheduler"} & set(self.extra))
        if clash:
            raise ValueError(
                f"extra must not hold {clash}: the optimizer (MuonClip) and lr schedule come from optim/train"
            )
        return self


@register_run_config
class SFTConfig(K2Config):
    """Supervised fine-tuning on chat rows (e.g. `k2post synth` output) with MuonClip under DeepSpeed."""

    kind: Literal["sft"] = Field("sft", description="Run config kind; must be 'sft'.")
    run_dir: str = Field(
        "runs/sft_tool_use",
        description="Outputs: metrics.jsonl, data_report.json, checkpoints/step-N, final/ (HF model), summary.json.",
    )
    model: ModelConfig = Field(
        default_factory=ModelConfig, description="The model to fine-tune (built from its flavor if missing)."
    )
    data: SFTDataConfig = Field(
        default_factory=SFTDataConfig, description="The chat dataset and how it is tokenized and split."
    )
    optim: OptimConfig = Field(
        default_factory=lambda: OptimConfig(lr=2e-3, weight_decay=0.1),
        description="MuonClip settings; optim.lr is the peak lr of the schedule.",
    )
    train: SFTTrainConfig = Field(default_factory=SFTTrainConfig, description="The training loop.")
    qat: QATConfig = Field(
        default_factory=QATConfig, description="INT4 weight-only QAT of the chosen modules (K2 Thinking; docs/QAT.md)."
    )
    schedule: LRScheduleConfig = Field(
        default_factory=LRScheduleConfig, description="The lr schedule over the run's optimizer steps."
    )
    checkpoint: CheckpointConfig = Field(
        default_factory=CheckpointConfig, description="Resumable checkpoints every N optimizer steps."
    )
    deepspeed: SFTDeepSpeedConfig = Field(default_factory=SFTDeepSpeedConfig, description="The DeepSpeed engine.")
    resume: bool | Literal["auto"] = Field(
        False,
        description="Continue from the newest complete checkpoint in run_dir/checkpoints (false: run_dir must not "
        "hold an earlier run; auto: continue when it holds one, else start fresh, so resubmitting the same command "
        "continues the run).",
    )

    @model_validator(mode="after")
    def _check(self) -> "SFTConfig":
        steps = self.train.max_steps
        if steps is not None and self.schedule.warmup_steps >= steps:
            raise ValueError(
                f"schedule.warmup_steps ({self.schedule.warmup_steps}) must be < train.max_steps ({steps}): lower it"
            )
        if self.train.eval_every > 0 and self.data.eval_fraction == 0:
            raise ValueError(
                "train.eval_every > 0 needs held-out rows: set data.eval_fraction > 0 or train.eval_every: 0"
            )
        if self.model.dtype != "float32":
            raise ValueError(
                "model.dtype must be float32 for SFT (the optimizer keeps fp32 weights): use deepspeed.precision: bf16 "
                "for bf16 compute"
            )
        return self
