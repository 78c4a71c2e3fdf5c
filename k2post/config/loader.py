"""Load YAML configs into strict pydantic models, with dotted overrides and one-line errors.

    cfg = load_config("configs/demo.yaml", overrides=["sampling.temperature=0.7"])

Every failure raises `ConfigError` whose message is one line naming the file, the field
path and what would fix it, e.g.
    configs/demo.yaml: sampling.temprature: unknown key (did you mean 'temperature'?)
"""

from __future__ import annotations

import difflib
import re
import typing
from pathlib import Path
from typing import Any, Iterable, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from k2post.config.base import K2Config

ConfigT = TypeVar("ConfigT", bound=K2Config)


class ConfigError(ValueError):
    """A config file, override or value is invalid. The message is one readable line."""


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Parse a YAML file whose top level is a mapping (an empty file is `{}`)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{path}:{where}: invalid YAML: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of fields, got {type(data).__name__}")
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split `a.b.c=value` into (["a", "b", "c"], parsed value); the value is parsed as YAML."""
    key, sep, raw_value = text.partition("=")
    keys = key.strip().split(".")
    if not sep or not all(k.strip() for k in keys):
        raise ConfigError(f"override {text!r}: expected the form key.path=value (e.g. trainer.lr=1e-4)")
    try:
        value = yaml.safe_load(raw_value) if raw_value.strip() else ""
    except yaml.YAMLError:
        value = raw_value
    return [k.strip() for k in keys], _number_or_same(value)


_FLOAT_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")


def _number_or_same(value: Any) -> Any:
    """YAML 1.1 reads `1e-4` as a string; read scientific notation as a float."""
    if isinstance(value, str) and _FLOAT_RE.match(value.strip()):
        return float(value)
    return value


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Return a copy of `data` with each `key.path=value` override set (creating mappings; a number
    indexes an existing list, e.g. `envs.0.weight=2`)."""
    merged = _deep_copy(data)
    for text in overrides:
        keys, value = parse_override(text)
        node: Any = merged
        for depth, key in enumerate(keys[:-1]):
            node = _child(node, key, text, ".".join(keys[: depth + 1]))
        if isinstance(node, list):
            node[_index(node, keys[-1], text, ".".join(keys))] = value
        else:
            node[keys[-1]] = value
    return merged


def _index(items: list[Any], key: str, text: str, where: str) -> int:
    if not key.isdigit() or int(key) >= len(items):
        raise ConfigError(f"override {text!r}: {where}: {key!r} is not an index of a list of {len(items)}")
    return int(key)


def _child(node: Any, key: str, text: str, where: str) -> Any:
    """The section `key` of a mapping (created if missing) or the item `key` of a list."""
    child = node[_index(node, key, text, where)] if isinstance(node, list) else node.setdefault(key, {})
    if not isinstance(child, (dict, list)):
        raise ConfigError(f"override {text!r}: {where} is a value, not a section")
    return child


def _deep_copy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _deep_copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_deep_copy(v) for v in data]
    return data


def validate_config(cls: type[ConfigT], data: dict[str, Any], source: str) -> ConfigT:
    """Validate `data` into `cls`; a failure becomes a one-line `ConfigError` naming `source`."""
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, cls, source)) from None


def format_validation_error(err: ValidationError, cls: type[BaseModel], source: str) -> str:
    """One line: `source: field.path: what is wrong (hint)`, plus a count of further errors."""
    errors = err.errors(include_url=False)
    first = errors[0]
    loc = [str(p) for p in first["loc"]]
    field_path = ".".join(loc) or "<top level>"
    message = _describe_error(first, cls, loc)
    more = f" (+{len(errors) - 1} more error{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    return f"{source}: {field_path}: {message}{more}"


def _describe_error(error: dict[str, Any], cls: type[BaseModel], loc: list[str]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        known = _known_fields(cls, loc[:-1])
        close = difflib.get_close_matches(loc[-1], known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(sorted(known))}"
        return f"unknown key ({hint})"
    message = error["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    if kind not in ("missing",) and "input" in error and not isinstance(error["input"], dict):
        message += f" (got {error['input']!r})"
    return message


def _known_fields(cls: type[BaseModel], loc: list[str]) -> list[str]:
    """Field names of the model found by walking `loc` from `cls` (empty if not a model)."""
    model: Any = cls
    for part in loc:
        if part.isdigit():
            continue
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            return []
        model = _model_in_annotation(fields[part].annotation)
        if model is None:
            return []
    return list(getattr(model, "model_fields", {}))


def _model_in_annotation(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation like `X`, `X | None`, `list[X]`, `dict[str, X]`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin is None:
        return None
    for arg in typing.get_args(annotation):
        found = _model_in_annotation(arg)
        if found is not None:
            return found
    return None


def load_config(path: str | Path, cls: type[ConfigT], overrides: Iterable[str] = ()) -> ConfigT:
    """Read YAML at `path`, apply dotted `overrides`, validate into `cls`."""
    data = apply_overrides(read_yaml(path), overrides)
    return validate_config(cls, data, str(path))


def dump_yaml(config: BaseModel) -> str:
    """The config with all defaults filled in, as YAML (key order as declared)."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False, default_flow_style=False)
