"""Load a user's HF model dir with transformers, a failure as one line (what `model prepare` / `export` load).

transformers logs a multi-line load report and then raises "look at the above report" when the weights do not fit
the config (a config.json edited after saving, weights of another model). `load_user_model` silences that report
and raises ValueError naming the first weight whose stored shape differs from what config.json builds:

    model = load_user_model(source, "HF_DIR", lambda: AutoModelForCausalLM.from_pretrained(source))
    # ValueError: HF_DIR models/x: cannot load it as an HF causal LM (weights do not fit its config.json:
    #             model.layers.0.mlp.up_proj.weight is [512, 256] in model.safetensors but [1024, 256] by config.json)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def expected_shapes(source: Path) -> dict[str, tuple[int, ...]]:
    """{parameter name: shape} of the model config.json describes, built on the meta device ({} if it cannot be)."""
    from k2post.models.stats import load_config, meta_model

    try:
        return {name: tuple(t.shape) for name, t in meta_model(load_config(source)).state_dict().items()}
    except (ValueError, FileNotFoundError):
        return {}


def load_user_model(source: Path, what: str, load: Callable[[], T]) -> T:
    """`load()` with transformers' load report silenced; any failure is ValueError `<what> <source>: cannot load
    it as an HF causal LM (<why>)`, why = the first mismatched weight shape when there is one."""
    from transformers.utils import logging as hf_logging

    from k2post.models.weights import shape_mismatch

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return load()
    except Exception as err:  # noqa: BLE001 (user input: whatever transformers raises is a bad model dir)
        mismatch = shape_mismatch(source, expected_shapes(source))
        why = f"weights do not fit its config.json: {mismatch}" if mismatch else _first_line(err)
        raise ValueError(f"{what} {source}: cannot load it as an HF causal LM ({why})") from None
    finally:
        hf_logging.set_verbosity(verbosity)


def _first_line(err: BaseException) -> str:
    """The first line of an error's message, at most 200 characters (its type name when it has none)."""
    return (str(err).splitlines() or [type(err).__name__])[0][:200]
