"""Explicit registry of run configs, keyed by the YAML `kind` field.

A run config (what `k2post <command> CONFIG` takes) composes component configs and
declares `kind: Literal["<name>"] = "<name>"`. Registering two classes under one kind
is an error.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Iterable

from k2post.config.base import K2Config
from k2post.config.loader import ConfigError, apply_overrides, read_yaml, validate_config

RUN_CONFIGS: dict[str, type[K2Config]] = {}


def register_run_config(cls: type[K2Config]) -> type[K2Config]:
    """Class decorator: register `cls` under the default of its `kind` field."""
    field = cls.model_fields.get("kind")
    if field is None or not isinstance(field.default, str):
        raise TypeError(f"{cls.__name__} needs a field `kind: Literal['name'] = 'name'` to be a run config")
    kind = field.default
    if kind in RUN_CONFIGS:
        raise ValueError(
            f"run config kind {kind!r} is already registered by {RUN_CONFIGS[kind].__name__}; "
            f"pick another kind for {cls.__name__}"
        )
    RUN_CONFIGS[kind] = cls
    return cls


def _kind_of(data: dict[str, Any], source: str) -> str:
    kinds = sorted(RUN_CONFIGS)
    kind = data.get("kind")
    if kind is None:
        raise ConfigError(f"{source}: kind: missing; add `kind: <one of {', '.join(kinds)}>` at the top")
    if kind not in RUN_CONFIGS:
        close = difflib.get_close_matches(str(kind), kinds, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known kinds: {', '.join(kinds)}"
        raise ConfigError(f"{source}: kind: unknown run kind {kind!r} ({hint})")
    return kind


def load_run_config(path: str | Path, overrides: Iterable[str] = (), expected_kind: str | None = None) -> K2Config:
    """Load a run config YAML: pick its class by `kind`, apply overrides, validate."""
    from k2post.config import runs  # noqa: F401  (registers the built-in run configs)

    source = str(path)
    data = apply_overrides(read_yaml(path), overrides)
    kind = _kind_of(data, source)
    if expected_kind is not None and kind != expected_kind:
        raise ConfigError(f"{source}: kind: this is a {kind!r} config but the command needs kind {expected_kind!r}")
    return validate_config(RUN_CONFIGS[kind], data, source)
