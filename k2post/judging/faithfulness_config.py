"""Config of `k2post judge train CONFIG` (YAML `kind: judge`): a sentence-level faithfulness judge
fine-tuned on (source, sentence) pairs synthesized from the knowledge corpus (k2post/judging/faithfulness_pairs.py).

    kind: judge
    out_dir: runs/judge
    model: {flavor: tiny-qwen2, path: runs/judge/base}   # or any HF causal LM dir (flavor: null)
    data: {train_entities: 300, train_pairs: 20000}
    train: {steps: 1500, batch_size: 32, lr: 1.0e-3}

Torch-free (commands validate configs before importing torch).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from k2post.config.base import K2Config
from k2post.config.registry import register_run_config
from k2post.models.config import ModelConfig


class JudgeDataConfig(K2Config):
    """Which synthetic pairs train and select the judge (entities of train and dev never overlap)."""

    corpus_seed: int = Field(0, description="Seed of the train corpus; dev uses corpus_seed + 1 (other entities).")
    train_entities: int = Field(300, ge=3, description="Entities of the train corpus.")
    train_pairs: int = Field(20000, ge=10, description="Train pairs drawn from them (half supported).")
    dev_entities: int = Field(60, ge=3, description="Entities of the dev corpus (threshold and model selection).")
    dev_pairs: int = Field(600, ge=10, description="Dev pairs (half supported).")


class JudgeTrainLoopConfig(K2Config):
    """The fine-tuning loop (AdamW on a yes/no label token; see docs/REPHRASE.md)."""

    lm_steps: int = Field(
        0,
        ge=0,
        description="Language-model steps first (next-token loss on the train corpus's documents in `lm_wordings` "
        "wordings): a model that has read such text learns the judge's matching faster (0: start classifying at once).",
    )
    lm_wordings: int = Field(
        20, ge=1, description="Wordings of each train document in the LM phase (0 = the original)."
    )
    steps: int = Field(1500, ge=1, description="Classification steps (after the LM steps).")
    batch_size: int = Field(32, ge=1, description="Pairs per step.")
    lr: float = Field(1e-3, gt=0, description="Peak AdamW learning rate (linear warmup, cosine decay to 10%).")
    warmup_steps: int = Field(50, ge=0, description="Linear warmup steps.")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay.")
    max_seq_len: int = Field(256, ge=32, description="Most tokens of a prompt; longer sources keep their sentences "
                             "closest to the claim (k2post/judging/faithfulness_model.py).")  # fmt: skip
    evidence_tokens: int = Field(
        64,
        ge=8,
        description="Most tokens of source evidence in a prompt: the source sentences sharing the most "
        "words with the claim, in source order.",
    )
    eval_every: int = Field(250, ge=1, description="Dev accuracy every N steps; the best dev step is kept.")
    threads: int | None = Field(None, ge=1, description="torch CPU threads (null: torch's default).")

    @model_validator(mode="after")
    def _warmup_below_steps(self) -> "JudgeTrainLoopConfig":
        if self.warmup_steps >= self.steps:
            raise ValueError(f"warmup_steps {self.warmup_steps} >= steps {self.steps}: lower warmup_steps")
        return self


@register_run_config
class JudgeTrainConfig(K2Config):
    """Fine-tune a small causal LM into a sentence-level faithfulness judge."""

    kind: Literal["judge"] = Field("judge", description="Run config kind; must be 'judge'.")
    out_dir: str = Field("runs/judge", description="Writes model/ (HF dir + judge.json) and metrics.jsonl here.")
    seed: int = Field(0, description="Seed of torch and of the pair order.")
    model: ModelConfig = Field(
        default_factory=lambda: ModelConfig(flavor="tiny-qwen2", path="runs/judge/base"),
        description="The model to fine-tune (built from its flavor when the path does not exist).",
    )
    data: JudgeDataConfig = Field(default_factory=JudgeDataConfig, description="The synthetic pairs.")
    train: JudgeTrainLoopConfig = Field(default_factory=JudgeTrainLoopConfig, description="The loop.")
    progress_bar: bool = Field(True, description="Show a live progress bar when stderr is a terminal.")
    dtype: Literal["float32"] = Field("float32", description="Training dtype (CPU fp32).")
