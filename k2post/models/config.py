"""`ModelConfig`: which model a run uses, and how to build it when it does not exist yet.

`path` is an HF model directory (any HF causal LM dir works). When it does not exist and
`flavor` names a registered tiny flavor (`k2post.models.flavors`), `ensure_model` builds it
there from `seed` and a fresh tokenizer of `vocab_size` entries with the `chat_format` template.
`is_model_dir(path)`: does `path` hold one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from k2post.config.base import K2Config
from k2post.models.flavors import FLAVORS, unknown_flavor_message


def is_model_dir(path: str | Path) -> bool:
    """True when `path` is a directory holding an HF `config.json` (here, not in `loading`, so that commands can
    check a path before importing torch)."""
    return (Path(path) / "config.json").is_file()


class ModelConfig(K2Config):
    """The policy model: an HF dir, optionally built from a registered tiny flavor."""

    flavor: str | None = Field(
        default="tiny-qwen2",
        description="Registered tiny flavor to build at `path` if it does not exist yet "
        "(e.g. tiny-qwen2, tiny-k2); null = `path` must already be an HF model dir.",
    )
    path: str = Field(
        default="artifacts/models/tiny-qwen2",
        description="HF model directory (config.json + weights + tokenizer); built from `flavor` if missing.",
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        default="float32",
        description="Dtype the model weights are loaded in.",
    )
    seed: int = Field(
        default=0,
        description="Seed for the random init (and tokenizer) when the model is built from `flavor`.",
    )
    vocab_size: int = Field(
        default=4096,
        gt=0,
        description="Tokenizer vocabulary size used when building from `flavor` "
        "(the model's embedding rows are rounded up to a multiple of 64).",
    )

    chat_format: Literal["instruct", "thinking"] = Field(
        default="instruct",
        description="K2 chat template of the tokenizer built from `flavor`: instruct (K2-Instruct, no reasoning "
        "rendered) or thinking (K2-Thinking: <think> blocks, the generation prompt ends with <think>). An existing "
        "model dir keeps the template its tokenizer has (`k2post model prepare --chat-format` sets it).",
    )

    @field_validator("flavor")
    @classmethod
    def _flavor_is_registered(cls, flavor: str | None) -> str | None:
        """Reject flavor names that are not in the registry, listing the known ones."""
        if flavor is not None and flavor not in FLAVORS:
            raise ValueError(unknown_flavor_message(flavor))
        return flavor
