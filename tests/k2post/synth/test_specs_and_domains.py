"""Tool spec loading/validation, the shipped specs, synthetic record-store domains, tasks."""

from __future__ import annotations

import json
import random

import pytest

from k2post.toolsets import TOOLSETS
from k2post.toolsets.checks import scenario_split
from k2post.synth.domains import DomainError, build_domains
from k2post.synth.judge import RubricJudge
from k2post.synth.record_store import BLUEPRINTS
from k2post.synth.roles import ReferenceAgent, RuleToolSimulator, RuleUser
from k2post.synth.specs import SHIPPED_SPECS, ToolSpecError, load_tool_specs, parse_domain_spec, spec_fingerprint
from k2post.synth.tasks import PERSONAS, agent_for, make_tasks
from k2post.synth.trajectory import run_trajectory


def test_shipped_specs_equal_the_toolsets():
    loaded = {spec.domain: spec for spec in load_tool_specs(SHIPPED_SPECS)}
    assert set(loaded) == set(TOOLSETS)
    for name, toolset in TOOLSETS.items():
        assert spec_fingerprint(loaded[name].tools) == spec_fingerprint(toolset.tools()), name


GOOD_TOOL = {
    "name": "pay",
    "description": "Pay.",
    "inputSchema": {"type": "object", "properties": {"amount": {"type": "number"}}, "required": ["amount"]},
}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("tools", r"top level must be a tools/list result"),
        ({"result": {"tools": []}}, r"top level must be a tools/list result"),
        ([], "tools: must be a non-empty list"),
        ({"jsonrpc": "2.0", "id": 1, "result": {"tools": []}}, "tools: must be a non-empty list"),
        ({"tools": [{**GOOD_TOOL, "outputSchema": []}]}, r"tools\[0\]\.outputSchema: must be an object"),
        ({"domain": "bank"}, "tools: must be a non-empty list"),
        ({"domain": "bad name", "tools": [GOOD_TOOL]}, "domain: 'bad name' is not a valid name"),
        ({"domain": "b", "tools": [GOOD_TOOL], "extra": 1}, "extra: unknown key"),
        ({"domain": "b", "tools": [GOOD_TOOL, GOOD_TOOL]}, "tool name 'pay' appears twice"),
        (
            {"domain": "b", "tools": [{**GOOD_TOOL, "name": "pay me"}]},
            r"tools\[0\]\.name: 'pay me' is not a valid tool name",
        ),
        (
            {"domain": "b", "tools": [{**GOOD_TOOL, "inputSchema": {"type": "array"}}]},
            r"tools\[0\]\.inputSchema: must be a JSON schema with type 'object'",
        ),
        (
            {
                "domain": "b",
                "tools": [{**GOOD_TOOL, "inputSchema": {"type": "object", "properties": {}, "required": ["amount"]}}],
            },
            r"tools\[0\]\.inputSchema\.required\[0\]: 'amount' is not a property",
        ),
        (
            {
                "domain": "b",
                "tools": [{**GOOD_TOOL, "inputSchema": {"type": "object", "properties": {"a": {"type": "money"}}}}],
            },
            r"tools\[0\]\.inputSchema\.properties\.a\.type: 'money' is not a JSON type",
        ),
        (
            {
                "domain": "b",
                "tools": [
                    {
                        **GOOD_TOOL,
                        "inputSchema": {
                            "type": "object",
                            "properties": {"a": {"type": "array", "items": {"type": "x"}}},
                        },
                    }
                ],
            },
            r"properties\.a\.items\.type: 'x'",
        ),
    ],
)
def test_bad_spec_names_file_and_field(data, message):
    with pytest.raises(ToolSpecError, match=rf"^specs/x\.json: .*{message}"):
        parse_domain_spec(data, "specs/x.json")


def test_spec_directory_errors(tmp_path):
    with pytest.raises(ToolSpecError, match="does not exist"):
        load_tool_specs(tmp_path / "nope")
    (tmp_path / "a.json").write_text("{not json")
    with pytest.raises(ToolSpecError, match=r"a\.json: not valid JSON"):
        load_tool_specs(tmp_path)
    (tmp_path / "a.json").write_text(json.dumps({"domain": "d", "tools": [GOOD_TOOL]}))
    (tmp_path / "b.json").write_text(
        json.dumps({"domain": "d", "tools": [{"type": "function", "function": {**GOOD_TOOL, "name": "x"}}]})
    )
    with pytest.raises(ToolSpecError, match=r"b\.json: domain: 'd' is already defined in .*a\.json"):
        load_tool_specs(tmp_path)


def test_unknown_and_duplicate_domains_are_errors():
    with pytest.raises(DomainError, match="unknown domain 'weather'; known: .*inventory"):
        build_domains(["weather"])
    with pytest.raises(DomainError, match="listed twice"):
        build_domains(["bank", "bank"])
    with pytest.raises(DomainError, match="already a built-in"):
        build_domains(["bank"], [BLUEPRINTS["inventory"].model_copy(update={"domain": "bank"})])


def test_record_store_tools_behave():
    domain = build_domains(["inventory"])["inventory"]
    names = [t.name for t in domain.tools()]
    assert names == ["list_items", "get_item", "add_item", "set_item_quantity", "remove_item"]
    scenario = next(iter(domain.templates.values()))(random.Random(3))
    state, tools = domain.new_state(scenario), domain.toolset
    assert tools.call(state, "add_item", {"name": "rope", "quantity": 3, "location": "aisle 1"}) == "Added item 'rope'."
    assert "already exists" in tools.call(state, "add_item", {"name": "ROPE", "quantity": 1, "location": "x"})
    assert json.loads(tools.call(state, "get_item", {"name": "rope"})) == {
        "name": "rope",
        "quantity": 3,
        "location": "aisle 1",
    }
    assert tools.call(state, "set_item_quantity", {"name": "rope", "quantity": -1}).startswith(
        "Error: set_item_quantity:"
    )
    assert tools.call(state, "remove_item", {"name": "rope"}) == "Removed item 'rope'."
    assert tools.call(state, "get_item", {"name": "rope"}) == "Error: get_item: no item with name 'rope'"
    assert tools.call(state, "fly", {}).startswith("Error: unknown tool 'fly'")


@pytest.mark.parametrize("domain_name", ["bank", "calendar", "filesystem", "inventory", "tickets", "recipes"])
def test_reference_solutions_pass_their_rubric(domain_name):
    domain = build_domains([domain_name])[domain_name]
    tasks = make_tasks(domain, "train", 12, seed=1, personas=list(PERSONAS))
    assert len({t.scenario.template for t in tasks}) >= 2 and all(
        scenario_split(t.scenario, 0.1) == "train" for t in tasks
    )
    for task in tasks:
        traj, verdict = _reference_run(domain, task)
        assert verdict.accepted, (task.id, verdict.reasons)
        assert traj.messages[1].content.count(task.scenario.prompt) == 1  # the persona wraps the request


def _reference_run(domain, task):
    """The reference agent's trajectory on the rule simulator, and the rubric judge's verdict on it."""
    state = domain.new_state(task.scenario)
    traj = run_trajectory(
        agent_for(domain).system_prompt,
        domain.tools(),
        ReferenceAgent(task, random.Random(0), 0.0),
        RuleUser(task),
        RuleToolSimulator(domain.toolset, state),
        max_turns=8,
    )
    return traj, RubricJudge().judge(task, traj, state.model_dump(mode="json"))


def test_test_split_tasks_are_disjoint_from_train():
    domain = build_domains(["tickets"])["tickets"]
    train = {t.scenario.model_dump_json() for t in make_tasks(domain, "train", 40, 0, ["direct"])}
    test = make_tasks(domain, "test", 10, 0, ["direct"])
    assert all(t.scenario.model_dump_json() not in train and t.split == "test" for t in test)


def test_a_blueprint_with_a_negative_range_accepts_its_own_reference_solutions():
    """The schema's bounds come from number_range (a fixed `minimum: 0` rejected negative values)."""
    freezer = BLUEPRINTS["inventory"].model_copy(
        update={"domain": "freezer", "number": "celsius", "number_range": (-30, -5)}
    )
    domain = build_domains(["freezer"], [freezer])["freezer"]
    add = next(t for t in domain.tools() if t.name == "add_item")
    assert add.parameters["properties"]["celsius"] | {"description": ""} == {
        "type": "integer",
        "minimum": -30,
        "maximum": -5,
        "description": "",
    }
    for task in make_tasks(domain, "train", 6, seed=2, personas=list(PERSONAS)):
        assert _reference_run(domain, task)[1].accepted, task.id
    with pytest.raises(ValueError, match=r"number_range \(3, 3\): needs low < high"):
        BLUEPRINTS["inventory"].model_validate({**BLUEPRINTS["inventory"].model_dump(), "number_range": (3, 3)})
