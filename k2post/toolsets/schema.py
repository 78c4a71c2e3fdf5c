"""A small JSON-schema checker for tool arguments, with model-readable error strings.

Covers the subset the toolsets declare: `type` (string, integer, number, boolean, array,
object, null), `required`, `additionalProperties: false`, `properties`, `items`, `enum`,
`minimum`/`maximum` (and exclusive), `minLength`/`maxLength`, `pattern`, `minItems`/`maxItems`, `const`,
`anyOf`/`oneOf` (at least one alternative; local `$ref`s are inlined by `schema_values.inline_refs`). An integral
float (`30.0`) counts as an integer, as in JSON Schema; a bool is never a number; NaN and
infinities are rejected. A `pattern` is matched with the `regex` package under a time limit (`PATTERN_TIMEOUT_S`):
a spec's backtracking pattern on a model-written argument cannot stall the rollout; an argument it cannot check in
time is refused. `pattern_problem` is what spec loading asks of every pattern (compiles, at most
`MAX_PATTERN_CHARS`, repeat counts at most `MAX_PATTERN_REPEAT`).

    error = check_arguments(schema, {"amount": "25"})
    # "argument 'amount' must be a number, got string"
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any

import regex

MAX_PATTERN_CHARS = 1000
"""Longest `pattern` a spec may declare."""
MAX_PATTERN_REPEAT = 1000
"""Largest repeat count (`a{2000}`) a spec pattern may declare (values are generated from patterns)."""
_REPEAT_COUNT = re.compile(r"\{\s*(\d+)")
PATTERN_TIMEOUT_S = 0.05
"""Seconds one pattern match may take; an argument the pattern cannot judge in time is refused."""

_TYPE_NAMES = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    list: "array",
    dict: "object",
    type(None): "null",
}


def json_type_name(value: Any) -> str:
    """The JSON type name of a decoded JSON value."""
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def is_type(value: Any, expected: str) -> bool:
    """Whether `value` is an instance of JSON-schema type `expected`."""
    if isinstance(value, bool):
        return expected == "boolean"
    if expected == "integer":
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if expected == "number":
        return isinstance(value, (int, float))
    return json_type_name(value) == expected


def bound(schema: dict[str, Any], key: str) -> float | None:
    """A numeric bound of a schema (`minimum`, `exclusiveMaximum`, ...), or None when absent or not a number
    (draft-4's boolean `exclusiveMinimum` is not a bound)."""
    value = schema.get(key)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _check_bounds(path: str, value: Any, schema: dict[str, Any]) -> str | None:
    """Numeric and length bounds of one value."""
    where = f"argument '{path}'"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where} must be a finite number, got {value}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{where} must be >= {schema['minimum']}, got {value}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{where} must be <= {schema['maximum']}, got {value}"
        low, high = bound(schema, "exclusiveMinimum"), bound(schema, "exclusiveMaximum")
        if low is not None and value <= low:
            return f"{where} must be > {low}, got {value}"
        if high is not None and value >= high:
            return f"{where} must be < {high}, got {value}"
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            return f"{where} must have at least {schema['minLength']} characters"
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            return f"{where} must have at most {schema['maxLength']} characters"
        if isinstance(schema.get("pattern"), str):
            return _check_pattern(where, schema["pattern"], value)
    return None


def _check_pattern(where: str, pattern: str, value: str) -> str | None:
    found = pattern_search(pattern, value)
    if found is None:
        problem = pattern_problem(pattern)
        if problem:
            return f"{where} cannot be checked: the tool's pattern {problem}"
        return f"{where} could not be checked against the pattern {pattern!r} in time (send a shorter value)"
    return None if found else f"{where} must match the pattern {pattern!r}, got {value[:200]!r}"


class PatternTooLarge(ValueError):
    """A pattern over MAX_PATTERN_CHARS or with a repeat count over MAX_PATTERN_REPEAT (compiling it could take
    minutes: it is refused before)."""


def _written_repeat(pattern: str) -> int:
    """The largest number written after a `{` in `pattern` (an upper bound of its repeat counts)."""
    return max((int(digits) for digits in _REPEAT_COUNT.findall(pattern[: MAX_PATTERN_CHARS + 1])), default=0)


@functools.lru_cache(maxsize=1024)
def compiled_pattern(pattern: str) -> regex.Pattern[str]:
    """`pattern` compiled once (the `regex` package: its matches take a timeout); regex.error when invalid,
    PatternTooLarge when too long or repeating more than the cap (checked on the text, before compiling)."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise PatternTooLarge(f"is {len(pattern)} characters long, over the cap of {MAX_PATTERN_CHARS}")
    repeat = _written_repeat(pattern)
    if repeat > MAX_PATTERN_REPEAT:
        raise PatternTooLarge(f"{pattern!r} repeats {repeat} times, over the cap of {MAX_PATTERN_REPEAT}")
    return regex.compile(pattern)


def pattern_search(pattern: str, value: str, timeout_s: float = PATTERN_TIMEOUT_S) -> bool | None:
    """Whether `pattern` matches somewhere in `value` (JSON Schema's reading), None when it took over `timeout_s`
    (or the pattern is invalid or too long: specs are checked at load, `pattern_problem`)."""
    try:
        return compiled_pattern(pattern).search(value, timeout=timeout_s) is not None
    except (regex.error, PatternTooLarge, TimeoutError, RecursionError, OverflowError):
        return None


def pattern_problem(pattern: Any) -> str | None:
    """Why a spec's `pattern` is refused (not a string, too long, a repeat count over the cap, invalid), or None."""
    if not isinstance(pattern, str):
        return f"must be a string, got {json_type_name(pattern)}"
    try:
        compiled_pattern(pattern)
    except PatternTooLarge as err:
        return str(err)
    except (regex.error, ValueError, OverflowError, RecursionError) as err:
        return f"{pattern!r} is not a valid regular expression ({' '.join(str(err).split())})"
    return None


def _check_array(path: str, value: list[Any], schema: dict[str, Any]) -> str | None:
    """Size bounds and items of an array."""
    where = f"argument '{path}'"
    if len(value) < schema.get("minItems", 0):
        return f"{where} must have at least {schema['minItems']} items"
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        return f"{where} must have at most {schema['maxItems']} items"
    items = schema.get("items")
    if isinstance(items, dict):
        for index, item in enumerate(value):
            error = check_value(f"{path}[{index}]", item, items)
            if error is not None:
                return error
    return None


def _check_alternatives(path: str, value: Any, schema: dict[str, Any]) -> str | None:
    """`const`, and `anyOf`/`oneOf` (one alternative must accept the value; the first one's problem otherwise)."""
    if "const" in schema and value != schema["const"]:
        return f"argument '{path}' must be {schema['const']!r}, got {value!r}"
    options = [o for o in schema.get("anyOf") or schema.get("oneOf") or [] if isinstance(o, dict)]
    problems = [check_value(path, value, option) for option in options]
    if problems and all(problems):
        return problems[0]
    return None


def check_value(path: str, value: Any, schema: dict[str, Any]) -> str | None:
    """The first problem of `value` against `schema`, or None; `path` names the argument."""
    where = f"argument '{path}'"
    alternative = _check_alternatives(path, value, schema)
    if alternative is not None:
        return alternative
    expected = schema.get("type")
    allowed = expected if isinstance(expected, list) else [expected] if expected else []
    if allowed and not any(is_type(value, name) for name in allowed):
        wanted = " or ".join(allowed)
        return f"{where} must be {_article(wanted)} {wanted}, got {json_type_name(value)}"
    if "enum" in schema and value not in schema["enum"]:
        options = ", ".join(repr(option) for option in schema["enum"])
        return f"{where} must be one of {options}, got {value!r}"
    if isinstance(value, list):
        return _check_array(path, value, schema)
    if isinstance(value, dict):
        return check_object(value, schema, prefix=f"{path}.")
    return _check_bounds(path, value, schema)


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def check_object(value: dict[str, Any], schema: dict[str, Any], prefix: str = "") -> str | None:
    """Required keys, unexpected keys and each property of an object."""
    properties: dict[str, Any] = schema.get("properties", {})
    for key in schema.get("required", []):
        if key not in value:
            return f"missing required argument '{prefix}{key}'"
    if schema.get("additionalProperties") is False:
        for key in value:
            if key not in properties:
                known = ", ".join(properties) or "none"
                return f"unexpected argument '{prefix}{key}' (accepted: {known})"
    for key, item in value.items():
        if key in properties:
            error = check_value(f"{prefix}{key}", item, properties[key])
            if error is not None:
                return error
    return None


def check_arguments(schema: dict[str, Any], arguments: Any) -> str | None:
    """The first problem of a tool's arguments object against its parameters schema, or None."""
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, got {json_type_name(arguments)}"
    return check_object(arguments, schema)


def with_defaults(schema: dict[str, Any], arguments: dict[str, Any]) -> dict[str, Any]:
    """`arguments` plus the declared default of every absent property."""
    properties: dict[str, Any] = schema.get("properties", {})
    defaults = {key: spec["default"] for key, spec in properties.items() if "default" in spec}
    return {**defaults, **arguments}
