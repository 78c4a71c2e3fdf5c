"""Resolve a `ModelConfig` to a model dir, and load models / tokenizers from HF dirs.

`ensure_model(cfg)` returns `cfg.path` when it already holds an HF model (config.json),
builds it from `cfg.flavor` otherwise, and fails with an actionable message when neither
is possible. `load_causal_lm` / `load_tokenizer` wrap the Auto classes with a clear error
when the directory is not a model dir.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from k2post.models.config import ModelConfig, is_model_dir
from k2post.models.flavors import known_flavors
from k2post.models.init import init_model_dir
from k2post.models.weights import check_weights

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}
TOKENIZER_FILES: tuple[str, ...] = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def ensure_model(cfg: ModelConfig) -> Path:
    """Return `cfg.path` as an HF model dir, building it from `cfg.flavor` if missing."""
    path = Path(cfg.path)
    if is_model_dir(path):
        check_weights(path, "model.path")
        return path
    if path.is_file():
        raise FileNotFoundError(
            f"model.path {cfg.path!r} is a file, not a model directory (an HF dir with config.json)"
        )
    if cfg.flavor is None:
        state = "has no config.json, so it is not an HF model dir" if path.is_dir() else "does not exist"
        raise FileNotFoundError(
            f"model.path {cfg.path!r} {state} and model.flavor is null: set model.flavor "
            f"to one of {known_flavors()} or point model.path at an HF model dir"
        )
    try:
        return init_model_dir(cfg.flavor, path, seed=cfg.seed, vocab_size=cfg.vocab_size, chat_format=cfg.chat_format)
    except FileExistsError:
        if is_model_dir(path):  # built concurrently by another process
            return path
        raise


def _require_model_dir(path: str | Path, what: str) -> Path:
    """`path` as a Path, or FileNotFoundError explaining what a model dir needs."""
    model_dir = Path(path)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"{what}: {str(model_dir)!r} is not a directory (expected an HF model dir)")
    if not is_model_dir(model_dir):
        raise FileNotFoundError(
            f"{what}: {str(model_dir)!r} has no config.json, so it is not an HF model dir "
            "(build one with init_model_dir or set model.flavor)"
        )
    return model_dir


def load_causal_lm(path: str | Path, dtype: str = "float32") -> PreTrainedModel:
    """Load the causal LM saved in `path` in `dtype` ("float32" or "bfloat16")."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    model_dir = _require_model_dir(path, "load_causal_lm")
    check_weights(model_dir, "model dir")
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[dtype])


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """Load the tokenizer saved in the model dir `path`."""
    model_dir = _require_model_dir(path, "load_tokenizer")
    if not any((model_dir / name).is_file() for name in TOKENIZER_FILES):
        raise FileNotFoundError(
            f"load_tokenizer: {str(model_dir)!r} has no tokenizer files ({', '.join(TOKENIZER_FILES)})"
        )
    return AutoTokenizer.from_pretrained(model_dir)
