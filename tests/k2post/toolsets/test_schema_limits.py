"""Hostile MCP specs stay bounded: a backtracking `pattern` cannot stall argument checks, and a spec whose checking or
simulation would be unbounded (invalid or huge pattern, `$ref` fan-out, deep nesting, minLength/minItems of 1e9,
infinite bounds) is refused at load with one line naming the file, the tool and the field."""

from __future__ import annotations

import random
import re
import time
from typing import Any

import pytest

from k2post.synth.specs import ToolSpecError, parse_domain_spec
from k2post.toolsets.schema import check_value, pattern_problem
from k2post.toolsets.schema_values import pattern_string, sample_value

BACKTRACKING = ["^(a|a)*$", "^(a+)+b$", "^(\\w+\\s?)*$", "(x+x+)+y"]


@pytest.mark.parametrize("pattern", BACKTRACKING)
@pytest.mark.parametrize("length", [23, 40, 5000])
def test_a_backtracking_pattern_on_a_model_argument_is_bounded(pattern, length):
    value = "a" * length + "!"
    started = time.perf_counter()
    problem = check_value("q", value, {"type": "string", "pattern": pattern})
    assert time.perf_counter() - started < 1.0
    assert problem is None or problem.startswith("argument 'q'")


@pytest.mark.parametrize(
    "value, schema, problem",
    [
        ("AB-12", {"pattern": "^[A-Z]{2}-\\d+$"}, None),
        ("ab", {"pattern": "^[A-Z]+$"}, "must match the pattern '^[A-Z]+$'"),
        ("ab", {"pattern": "(unclosed"}, "cannot be checked: the tool's pattern '(unclosed' is not a valid"),
    ],
)
def test_patterns_still_check_arguments(value, schema, problem):
    got = check_value("q", value, {"type": "string", **schema})
    assert got is None if problem is None else problem in got


def _spec(properties: dict[str, Any], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    schema = {"type": "object", "properties": properties, **(extra or {})}
    return {"domain": "d", "tools": [{"name": "get_thing", "inputSchema": schema}]}


def _fan_out(width: int, levels: int) -> dict[str, Any]:
    defs = {
        f"n{i}": {"type": "object", "properties": {f"p{j}": {"$ref": f"#/$defs/n{i + 1}"} for j in range(width)}}
        for i in range(levels)
    }
    return _spec({"a": {"$ref": "#/$defs/n0"}}, {"$defs": defs})


def _deep(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}}
    return _spec({"a": schema})


def _nested_arrays(levels: int, min_items: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema, "minItems": min_items}
    return _spec({"a": schema}, {"required": ["a"]})


HOSTILE = {
    "invalid_pattern": (_spec({"q": {"type": "string", "pattern": "(unclosed"}}), r"properties\.q\.pattern: .*valid"),
    "long_pattern": (_spec({"q": {"type": "string", "pattern": "a" * 5000}}), r"properties\.q\.pattern: .*cap of"),
    "huge_repeat": (_spec({"q": {"type": "string", "pattern": "^a{1000000000}$"}}), r"q\.pattern: .*repeats"),
    "pattern_not_string": (_spec({"q": {"type": "string", "pattern": 5}}), r"q\.pattern: must be a string"),
    "ref_fan_out": (_fan_out(40, 8), r"inputSchema: expands to more than 5000"),
    "deep_nesting": (_deep(200), r"inputSchema: .*(nests deeper|more than 5000)"),
    "min_length": (_spec({"q": {"type": "string", "minLength": 10**9}}), r"q\.minLength: 1000000000 is not a count"),
    "min_items": (_spec({"q": {"type": "array", "minItems": 10**9}}), r"q\.minItems: 1000000000 is not a count"),
    "nested_min_items": (_nested_arrays(4, 100), r"more than 100000 values"),
    "infinite_bound": (
        _spec({"n": {"type": "integer", "minimum": float("inf")}}),
        r"n\.minimum: inf is not a finite number",
    ),
    "bad_item_pattern": (
        _spec({"q": {"type": "array", "items": {"type": "string", "pattern": "[z-a]"}}}),
        r"properties\.q\.items\.pattern: .*valid",
    ),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_an_unbounded_spec_is_one_line_naming_file_tool_and_field(name):
    spec, message = HOSTILE[name]
    started = time.perf_counter()
    with pytest.raises(ToolSpecError, match=r"^specs/x\.json: tools\[0\]\.inputSchema") as raised:
        parse_domain_spec(spec, "specs/x.json")
    assert time.perf_counter() - started < 1.0
    assert "\n" not in str(raised.value)
    assert re.search(message, str(raised.value)), str(raised.value)


def test_an_unbounded_output_schema_is_refused_too():
    spec = _spec({})
    spec["tools"][0]["outputSchema"] = {"type": "object", "properties": {"r": {"type": "string", "pattern": "(("}}}
    with pytest.raises(ToolSpecError, match=r"^specs/x\.json: tools\[0\]\.outputSchema\.properties\.r\.pattern"):
        parse_domain_spec(spec, "specs/x.json")


def test_specs_at_the_caps_load_and_simulate_quickly():
    spec = _spec(
        {
            "q": {"type": "string", "minLength": 10_000},
            "items": {"type": "array", "items": {"type": "integer"}, "minItems": 100},
            "code": {"type": "string", "pattern": "^[A-Z]{3}-\\d{4}$"},
        },
        {"required": ["q", "items", "code"]},
    )
    started = time.perf_counter()
    tool = parse_domain_spec(spec, "specs/x.json").tools[0]
    value = sample_value(tool.parameters, random.Random(0))
    assert len(value["q"]) >= 10_000 and len(value["items"]) >= 100
    assert check_value("args", value, tool.parameters) is None
    assert time.perf_counter() - started < 1.0


@pytest.mark.parametrize("pattern", BACKTRACKING + ["^a{1000000}$"])
def test_the_value_generator_is_bounded_on_any_pattern(pattern):
    started = time.perf_counter()
    pattern_string(pattern, random.Random(0), low=30)
    assert time.perf_counter() - started < 2.0


@pytest.mark.parametrize(
    "pattern, problem",
    [("^[a-z]+$", None), ("(", "not a valid"), ("a{2000}", "repeats 2000"), ("x" * 1001, "cap of 1000")],
)
def test_pattern_problem(pattern, problem):
    got = pattern_problem(pattern)
    assert got is None if problem is None else problem in got
