"""The schema-driven simulator of any MCP spec: values from schemas (checked with `jsonschema` as the
reference validator), tool plans, state kept across calls, outputs valid against outputSchema, and
generated tasks whose reference solutions pass their own rubric."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from k2post.chat.types import ToolSpec
from k2post.toolsets.base import is_error
from k2post.toolsets.checks import ToolCallRecord, answer_matches, check_checkpoint, check_state
from k2post.toolsets.schema import check_value
from k2post.toolsets.schema_values import conform, inline_refs, pattern_string, sample_value, unsatisfiable_patterns
from k2post.toolsets.spec_templates import decoded, spec_templates
from k2post.toolsets.spec_toolset import SpecToolset, collection_key, tool_kind

SCHEMAS: list[dict[str, Any]] = [
    {"type": "string"},
    {"type": "string", "minLength": 30, "maxLength": 40},
    {"type": "string", "maxLength": 3},
    {"type": "string", "enum": ["a", "b"]},
    {"const": 7},
    {"type": "string", "format": "date"},
    {"type": "string", "format": "date-time"},
    {"type": "string", "format": "email"},
    {"type": "string", "format": "uri"},
    {"type": "string", "format": "uuid"},
    {"type": "integer", "minimum": -5, "maximum": -3},
    {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 3},
    {"type": "number", "minimum": 0.5, "maximum": 0.75},
    {"type": "integer", "maximum": -100},
    {"type": "boolean"},
    {"type": ["string", "null"]},
    {"anyOf": [{"type": "null"}, {"type": "integer", "minimum": 10}]},
    {"oneOf": [{"type": "string", "enum": ["x"]}, {"type": "array", "items": {"type": "integer"}}]},
    {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 2},
    {"type": "array", "items": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}},
    {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {"b": {"type": "array", "items": {"type": "number"}}}}},
        "required": ["a"],
        "additionalProperties": False,
    },
    {"type": "string", "examples": ["Europe/Paris", "Asia/Tokyo"]},
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=[str(i) for i in range(len(SCHEMAS))])
def test_sampled_values_are_valid_against_the_schema(schema):
    for seed in range(20):
        value = sample_value(schema, random.Random(seed), complete=seed % 2 == 0)
        jsonschema.validate(value, schema)
        assert check_value("v", value, schema) is None


def test_refs_are_inlined_and_recursion_stops():
    tree = {
        "$defs": {"Node": {"type": "object", "properties": {"name": {"type": "string"}, "kids": {
            "type": "array", "items": {"$ref": "#/$defs/Node"}}}, "required": ["name"]}},
        "$ref": "#/$defs/Node",
    }  # fmt: skip
    plain = inline_refs(tree)
    assert "$defs" not in plain and plain["required"] == ["name"]
    for seed in range(10):
        jsonschema.validate(sample_value(plain, random.Random(seed), complete=True), tree)
    assert inline_refs({"$ref": "#/$defs/Missing"}) == {}


@pytest.mark.parametrize(
    ("value", "schema", "problem"),
    [
        (3, {"anyOf": [{"type": "string"}, {"type": "integer"}]}, None),
        (3.5, {"anyOf": [{"type": "string"}, {"type": "integer"}]}, "must be a string"),
        ("b", {"const": "a"}, "must be 'a'"),
        (0, {"type": "integer", "exclusiveMinimum": 0}, "must be > 0"),
        (3, {"type": "integer", "exclusiveMaximum": 3}, "must be < 3"),
        (5, {"type": "integer", "exclusiveMinimum": True, "minimum": 5}, None),  # draft-4 boolean: not a bound
    ],
)
def test_check_value_alternatives_and_exclusive_bounds(value, schema, problem):
    found = check_value("v", value, schema)
    assert (found is None) if problem is None else (problem in found)


def test_conform_keeps_valid_record_fields_and_fills_the_rest():
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "temp": {"type": "number"}, "n": {"type": "integer"}},
        "required": ["city", "temp", "n"],
        "additionalProperties": False,
    }
    value = conform({"city": "Oslo", "n": "not a number", "extra": 1}, schema, random.Random(0))
    jsonschema.validate(value, schema)
    assert value["city"] == "Oslo" and isinstance(value["n"], int) and "extra" not in value


@pytest.mark.parametrize(
    ("name", "annotations", "kind", "collection"),
    [
        ("get_weather", None, "read", "weather"),
        ("getCurrentWeather", None, "read", "current_weather"),
        ("list_tickets", None, "list", "ticket"),
        ("create-ticket", None, "create", "ticket"),
        ("delete_entries", None, "delete", "entry"),
        ("update_ticket_status", None, "update", "ticket_status"),
        ("convert_time", None, "action", "convert_time"),
        ("add_numbers", {"readOnlyHint": True}, "action", "add_numbers"),
        ("get", None, "read", "get"),
    ],
)
def test_tool_kind_from_name_and_annotations(name, annotations, kind, collection):
    assert tool_kind(name, annotations) == (kind, collection)


def _tool(name: str, properties: dict[str, Any], required: list[str]) -> ToolSpec:
    return ToolSpec(name=name, parameters={"type": "object", "properties": properties, "required": required})


def test_collection_key_prefers_ids_then_names():
    text = {"type": "string"}
    assert (
        collection_key([_tool("get_ticket", {"title": text, "ticket_id": text}, ["title", "ticket_id"])], "ticket")
        == "ticket_id"
    )
    assert collection_key([_tool("get_user", {"email": text, "name": text}, ["email", "name"])], "user") == "name"
    assert collection_key([_tool("get_user", {"tags": {"type": "array"}}, ["tags"])], "user") is None


TICKET_OUTPUT = {
    "type": "object",
    "properties": {
        "ticket_id": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "string", "enum": ["open", "closed"]},
        "priority": {"type": "integer", "minimum": 1, "maximum": 5},
    },
    "required": ["ticket_id", "title", "status", "priority"],
}
TEXT = {"type": "string"}
HELPDESK = [
    _tool("get_weather", {"city": TEXT, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, ["city"]),
    _tool("create_ticket", {"title": TEXT, "priority": {"type": "integer", "minimum": 1, "maximum": 5}}, ["title"]),
    _tool("get_ticket", {"ticket_id": TEXT}, ["ticket_id"]),
    _tool("list_tickets", {"priority": {"type": "integer"}}, []),
    _tool(
        "update_ticket", {"ticket_id": TEXT, "priority": {"type": "integer", "minimum": 1, "maximum": 5}}, ["ticket_id"]
    ),
    _tool("delete_ticket", {"ticket_id": TEXT}, ["ticket_id"]),
]


@pytest.fixture
def helpdesk() -> SpecToolset:
    return SpecToolset("helpdesk", "", HELPDESK, {"get_ticket": TICKET_OUTPUT, "update_ticket": TICKET_OUTPUT})


def test_state_is_kept_across_calls(helpdesk):
    state = helpdesk.new_state(toolset="helpdesk", seed=4)
    first = helpdesk.call(state, "get_weather", {"city": "Oslo"})
    assert helpdesk.call(state, "get_weather", {"city": "oslo "}) == first.replace('"Oslo"', '"oslo "')
    created = decoded(helpdesk.call(state, "create_ticket", {"title": "VPN down", "priority": 2}))
    ticket = decoded(helpdesk.call(state, "get_ticket", {"ticket_id": created["ticket_id"]}))
    jsonschema.validate(ticket, TICKET_OUTPUT)
    assert ticket["title"] == "VPN down" and ticket["priority"] == 2
    assert decoded(helpdesk.call(state, "get_ticket", {"ticket_id": created["ticket_id"]})) == ticket
    updated = decoded(helpdesk.call(state, "update_ticket", {"ticket_id": created["ticket_id"], "priority": 5}))
    assert updated["priority"] == 5 and updated["status"] == ticket["status"]
    assert [t["ticket_id"] for t in decoded(helpdesk.call(state, "list_tickets", {"priority": 5}))] == ["ticket-1"]
    assert decoded(helpdesk.call(state, "list_tickets", {"priority": 2})) == []
    assert not is_error(helpdesk.call(state, "delete_ticket", {"ticket_id": "TICKET-1"}))
    assert helpdesk.call(state, "get_ticket", {"ticket_id": "ticket-1"}) == (
        "Error: get_ticket: no ticket with ticket_id 'ticket-1'"
    )
    assert helpdesk.call(state, "get_weather", {}).startswith("Error: get_weather: missing required argument")
    assert helpdesk.call(state, "create_ticket", {"title": "x", "priority": 9}).startswith("Error: create_ticket:")


def test_same_seed_same_answers(helpdesk):
    answers = [
        helpdesk.call(helpdesk.new_state(toolset="helpdesk", seed=seed), "get_weather", {"city": "Lima"})
        for seed in (1, 1, 2)
    ]
    assert answers[0] == answers[1] != answers[2]


def replay_scores(toolset: SpecToolset, template) -> None:
    """The template's reference solution, replayed on the simulator, passes every check of its rubric."""
    scenario = template(random.Random(1))
    state = toolset.new_state(**scenario.initial_state)
    records = []
    for turn, calls in enumerate(scenario.reference_turns):
        for call in calls:
            result = toolset.call(state, call.name, call.arguments)
            records.append(ToolCallRecord(turn=turn, id=f"c{len(records)}", name=call.name, arguments=call.arguments,
                                          result=result, ok=not is_error(result)))  # fmt: skip
    final = state.model_dump(mode="json")
    assert all(record.ok for record in records), records
    assert all(check_state(check, final) for check in scenario.success), scenario.success
    assert all(check_checkpoint(point, records, final) for point in scenario.checkpoints)
    assert answer_matches(scenario.answer, scenario.reference_answer)
    initial = toolset.new_state(**scenario.initial_state).model_dump(mode="json")
    changed = [check for check in scenario.success if not check_state(check, initial)]
    writes = {"create", "update", "delete"} & {toolset.plans[c.name].kind for t in scenario.reference_turns for c in t}
    assert changed or not writes  # doing nothing fails a write task


def test_every_tool_gets_a_task_whose_reference_passes(helpdesk):
    templates = spec_templates(helpdesk)
    expected = {f"helpdesk_{t.name}" for t in HELPDESK} | {"helpdesk_create_ticket_then_get_ticket"}
    assert set(templates) == expected
    for template in templates.values():
        replay_scores(helpdesk, template)
    scenario = templates["helpdesk_create_ticket_then_get_ticket"](random.Random(3))
    assert "ticket-" not in scenario.prompt  # the created id is found, not given
    assert scenario.checkpoints[1].after is not None


def test_a_tool_whose_task_never_builds_is_left_out(caplog):
    """A pattern the generator cannot meet (a lookahead here) leaves the tool out, with one line naming the
    tool and the field; a pattern it can meet (40 digits) now gets a task."""
    impossible = _tool("get_code", {"code": {"type": "string", "pattern": "^(?=.*7)[0-9]{4}$"}}, ["code"])
    digits = _tool("get_digest", {"digest": {"type": "string", "pattern": "^[0-9]{40}$"}}, ["digest"])
    fine = _tool("get_city", {"name": TEXT}, ["name"])
    toolset = SpecToolset("codes", "", [impossible, digits, fine])
    with caplog.at_level("WARNING", logger="k2post.toolsets.spec_templates"):
        assert set(spec_templates(toolset)) == {"codes_get_city", "codes_get_digest"}
    assert [r.getMessage() for r in caplog.records] == [
        "k2post: warning: tool spec codes: no tasks for tool get_code: the value generator cannot meet "
        "get_code.input.code: pattern '^(?=.*7)[0-9]{4}$'; get_code.output.code: pattern '^(?=.*7)[0-9]{4}$'"
    ]  # the output too: a tool without an outputSchema answers its arguments


PATTERNS: list[dict[str, Any]] = [
    {"type": "string", "pattern": r"^[A-Z]{2}-\d{3,5}$"},
    {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"},
    {"type": "string", "pattern": r"^(open|closed|pending)_[a-z0-9]+$"},
    {"type": "string", "pattern": r"^[^@\s]+@[^@\s]+\.[a-z]{2,}$"},
    {"type": "string", "pattern": r"^v\d+\.\d+\.\d+(-rc\d+)?$"},
    {"type": "string", "pattern": r"^[0-9a-f]{40}$"},
    {"type": "string", "pattern": r"[a-z]"},  # unanchored: JSON Schema searches
    {"type": "string", "pattern": r"^\w+\s\S+.?$"},
    {"type": "string", "pattern": r"^[a-z]+$", "minLength": 5, "maxLength": 6},
    {"type": "string", "pattern": r"^[A-Za-z ]{3,8}$", "format": "email"},
    {"type": "array", "items": {"type": "string", "pattern": r"^#[0-9A-F]{6}$"}, "minItems": 2},
]


@pytest.mark.parametrize("schema", PATTERNS, ids=[str(i) for i in range(len(PATTERNS))])
@pytest.mark.parametrize("name", ["", "city", "timezone"])  # names that pick realistic strings too
def test_sampled_strings_match_their_pattern(schema, name):
    for seed in range(20):
        value = sample_value(schema, random.Random(seed), name)
        jsonschema.validate(value, schema)
    assert unsatisfiable_patterns(schema, "t.output") == []


@pytest.mark.parametrize(
    "schema, problems",
    [
        ({"type": "string", "pattern": r"^(?=.*\d)\w+$"}, ["t.output: pattern '^(?=.*\\d)\\w+$'"]),
        ({"type": "string", "pattern": r"^(ab)\1$"}, ["t.output: pattern '^(ab)\\1$'"]),
        (
            {"type": "object", "properties": {"zip": {"type": "string", "pattern": r"^\d{5}$", "maxLength": 4}}},
            ["t.output.zip: pattern '^\\d{5}$'"],
        ),
        ({"type": "array", "items": {"anyOf": [{"type": "string", "pattern": "(["}]}}, ["t.output[]: pattern '(['"]),
    ],
)
def test_patterns_the_generator_cannot_meet_are_named(schema, problems):
    assert unsatisfiable_patterns(schema, "t.output") == problems
    assert pattern_string("^(?=x)x$", random.Random(0)) is None


PATTERNED_OUTPUT = {
    "type": "object",
    "properties": {
        "ticket_id": {"type": "string", "pattern": r"^TCK-\d{4}$"},
        "commit": {"type": "string", "pattern": r"^[0-9a-f]{7,40}$"},
        "city": {"type": "string", "pattern": r"^[A-Z][a-z]+(-[A-Z][a-z]+)?$"},
        "labels": {"type": "array", "items": {"type": "string", "pattern": r"^(bug|feature|ops)/[a-z]{3,}$"}},
    },
    "required": ["ticket_id", "commit", "city", "labels"],
    "additionalProperties": False,
}


def test_simulated_outputs_honour_their_output_schemas_patterns():
    """Every answer of a tool whose outputSchema has patterns (reads, lists, writes) validates against it."""
    tools = [_tool("get_ticket", {"ticket_id": TEXT}, ["ticket_id"]), _tool("update_ticket", {"ticket_id": TEXT}, [])]
    toolset = SpecToolset("patterned", "", tools, {"get_ticket": PATTERNED_OUTPUT, "update_ticket": PATTERNED_OUTPUT})
    for seed in range(20):
        state = toolset.new_state(toolset="patterned", seed=seed)
        for name in ("get_ticket", "update_ticket"):
            result = toolset.call(state, name, {"ticket_id": f"t{seed}"})
            assert not is_error(result), result
            jsonschema.validate(decoded(result), PATTERNED_OUTPUT)
    assert "patterned_get_ticket" in spec_templates(toolset)


MCP_SPECS = sorted((Path(__file__).resolve().parent / "data" / "mcp_specs").glob("*.json"))


def test_no_recorded_mcp_tool_breaks_its_own_output_schema():
    """Over the recorded third-party specs (data/mcp_specs), every simulated answer of every tool with an
    outputSchema validates against the original schema ($refs, patterns and all): 0 of N tools break it."""
    from k2post.synth.domains import spec_domain
    from k2post.synth.specs import load_tool_specs

    broken, checked = [], 0
    for path in MCP_SPECS:
        (spec,) = load_tool_specs(path)
        toolset = spec_domain(spec).toolset
        raw = {tool["name"]: tool for tool in json.loads(path.read_text())["tools"] if "outputSchema" in tool}
        for tool in [t for t in spec.tools if t.name in raw]:
            checked += 1
            for seed in range(10):
                result = toolset.call(toolset.new_state(toolset=spec.domain, seed=seed), tool.name,
                                      sample_value(tool.parameters, random.Random(seed)))  # fmt: skip
                problem = None if is_error(result) else _schema_problem(decoded(result), raw[tool.name])
                if problem:
                    broken.append(f"{path.stem}.{tool.name} (seed {seed}): {problem}")
                    break
    assert checked >= 10 and broken == [], broken


def _schema_problem(value: Any, tool: dict[str, Any]) -> str | None:
    try:
        jsonschema.validate(value, tool["outputSchema"])
    except jsonschema.ValidationError as err:
        return err.message
    return None
