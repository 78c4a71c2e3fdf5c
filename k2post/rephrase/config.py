"""The `k2post rephrase CONFIG` run config (YAML `kind: rephrase`; the pipeline: k2post/rephrase/pipeline.py).

    kind: rephrase
    input: {path: data/docs.jsonl}            # or an HF dataset dir; no path: the synthetic knowledge corpus
    out_dir: data/rephrased                   # dataset/, shards/, dropped.jsonl, stats.json, config.yaml
    rewrites_per_document: 3
    chunk_tokens: 256
    styles: ["Rewrite the passage as an encyclopedia entry.", "Retell the passage as a story told by a guide."]
    backend: llm                              # builtin (the synthetic corpus's own renderer) or llm
    llm: {base_url: http://127.0.0.1:8000/v1}
    fidelity_judge: llm                       # checks, llm or model (a trained judge dir in judge_model)

Docs: docs/REPHRASE.md.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from k2post.config.base import K2Config
from k2post.config.registry import register_run_config
from k2post.llm.http_client import HTTPClientConfig

MAX_SYNTHETIC_ENTITIES = 100_000  # names grow a syllable when the short ones run out (corpus._unique_names)

DEFAULT_STYLES = [
    "Rewrite the passage in the style of an encyclopedia entry.",
    "Rewrite the passage as a short lecture by a teacher to students.",
    "Rewrite the passage as a news report.",
]


class RephraseInputConfig(K2Config):
    """Where the documents come from: a JSONL file / HF dataset dir, or the built-in synthetic knowledge corpus."""

    path: str | None = Field(
        None,
        description="JSONL file (one JSON object per line) or HF dataset dir (`save_to_disk`) of documents "
        "(null: the synthetic corpus).",
    )
    text_field: str = Field("text", description="Column holding each document's text.")
    id_field: str | None = Field(
        "id",
        description="Column holding each document's id (provenance of every rewrite; ids must be unique); "
        "null: documents are numbered `row-N` in input order.",
    )
    synthetic_entities: int = Field(
        200,
        ge=3,
        le=MAX_SYNTHETIC_ENTITIES,
        description="Without `path`: entities of the synthetic corpus (k2post.rephrase.corpus), one doc each "
        f"(at most {MAX_SYNTHETIC_ENTITIES:,}).",
    )


class RephraseSamplingConfig(K2Config):
    """Sampling of the LLM calls (backend: llm, fidelity_judge: llm)."""

    temperature: float = Field(0.7, ge=0, description="Sampling temperature of the rewrite calls.")
    max_tokens: int = Field(512, gt=0, description="Most tokens of one rewritten chunk.")
    judge_max_tokens: int = Field(
        128, gt=0, description="Most tokens of one judge reply (judge calls run at temperature 0)."
    )


@register_run_config
class RephraseConfig(K2Config):
    """Chunked autoregressive rewrites of documents with a fidelity check per chunk."""

    kind: Literal["rephrase"] = Field("rephrase", description="Run config kind; must be 'rephrase'.")
    seed: int = Field(0, description="Seed of the synthetic corpus (input without `path`).")
    input: RephraseInputConfig = Field(default_factory=RephraseInputConfig, description="The documents.")
    limit: int | None = Field(None, gt=0, description="Rephrase only the first `limit` documents (null: all).")
    out_dir: str = Field(
        "data/rephrased",
        description="Output directory: dataset/ (HF dataset of the rewrites, with provenance), shards/, "
        "dropped.jsonl, stats.json, config.yaml.",
    )
    rewrites_per_document: int = Field(1, ge=1, description="Rewrites of each document, each in its own style.")
    chunk_tokens: int = Field(256, ge=16, description="Most tokens per chunk; chunks end at sentence ends.")
    tokenizer: str | None = Field(
        None,
        description="Model dir (or hub name) whose tokenizer counts tokens for chunking and the stats; "
        "null: whitespace-separated words.",
    )
    context_chars: int = Field(
        2000,
        ge=0,
        description="Most characters of the already rewritten chunks of the document put in each rewrite prompt "
        "(the latest ones are kept; 0: none).",
    )
    styles: list[str] = Field(
        default_factory=lambda: list(DEFAULT_STYLES),
        min_length=1,
        description="Style / perspective instructions; rewrite k of a document uses styles[(k - 1) % len(styles)].",
    )
    backend: Literal["builtin", "llm"] = Field(
        "builtin",
        description="builtin: the synthetic corpus re-rendered in another template style (offline, for tests and the "
        "ablation); llm: every chunk rewritten through `llm` with the source and the rewritten chunks before it.",
    )
    llm: HTTPClientConfig | None = Field(
        None, description="The rewriting and judging endpoint (backend: llm, fidelity_judge: llm)."
    )
    llm_sampling: RephraseSamplingConfig = Field(
        default_factory=RephraseSamplingConfig, description="Sampling of the rewrite and judge calls."
    )
    fidelity_judge: Literal["checks", "llm", "model"] = Field(
        "checks",
        description="Who decides a rewritten chunk is faithful: checks (the deterministic checks only: every number "
        "and name of the source kept, no number added); llm (the checks, then a judge call through `llm`); model "
        "(the checks, then every rewritten sentence scored against the source chunk by the trained faithfulness "
        "judge in `judge_model`).",
    )
    judge_model: str | None = Field(
        None, description="Directory of a trained sentence-level faithfulness judge (fidelity_judge: model)."
    )
    max_retries: int = Field(2, ge=0, description="Rewrites of an unfaithful chunk before the document is dropped.")
    include_original: bool = Field(
        False,
        description="Also write each source document as a row with rewrite_index 0 and style 'original' "
        "(a ready training mix of originals and rephrasings).",
    )
    shard_size: int = Field(
        64, gt=0, description="Documents per shard (each finished shard is written at once; the resume unit)."
    )
    domain: str = Field("rephrase", min_length=1, description="Value of the dataset's `domain` column.")
    resume: bool = Field(
        True, description="Keep the shards a run of the same config already wrote in out_dir (false: start over)."
    )

    @model_validator(mode="after")
    def _llm_backend_needs_endpoint(self) -> "RephraseConfig":
        if self.backend == "llm" and self.llm is None:
            raise ValueError("backend: llm needs an `llm:` section with base_url (e.g. a `k2post serve` endpoint)")
        if self.backend == "builtin" and self.input.path is not None:
            raise ValueError(
                "backend: builtin re-renders the synthetic corpus only: drop input.path or use backend: llm"
            )
        if self.fidelity_judge == "llm" and self.llm is None:
            raise ValueError(
                "fidelity_judge: llm needs an `llm:` section with base_url (or fidelity_judge: checks / model)"
            )
        if self.fidelity_judge == "model" and not self.judge_model:
            raise ValueError(
                "fidelity_judge: model needs judge_model: the dir of a trained faithfulness judge "
                "(or fidelity_judge: checks / llm)"
            )
        if self.judge_model and self.fidelity_judge != "model":
            raise ValueError(f"judge_model is used by fidelity_judge: model only (it is {self.fidelity_judge!r})")
        return self
