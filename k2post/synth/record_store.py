"""Synthetic tools by domain: a blueprint (entity + fields) becomes a stateful toolset and tasks.

K2 evolves synthetic tools per domain next to real MCP specs. Here a `DomainBlueprint` (e.g.
inventory: entity "item" keyed by "name", fields quantity:integer, location:string) generates
five MCP-style tools (`list_items`, `get_item`, `add_item`, `set_item_quantity`, `remove_item`),
a rule-based simulator over a `RecordStoreState` (records by key, seeded transient failures like
every toolset), and four task templates whose Scenarios carry success checks, checkpoints,
expected answers and a reference solution:

    toolset = RecordStoreToolset(BLUEPRINTS["inventory"])
    scenario = record_templates(BLUEPRINTS["inventory"])["inventory_add_count"](random.Random(0))
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from k2post.toolsets.base import ToolError, Toolset, ToolsetState, tool_spec
from k2post.toolsets.checks import Checkpoint, Scenario, called, expect, ref_call
from k2post.chat.types import ToolSpec

FieldKind = Literal["string", "integer"]


class DomainBlueprint(BaseModel):
    """How to synthesize a record-store domain."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    domain: str = Field(description="Domain name (also the toolset name).")
    description: str = Field(description="What the records are, for the system prompt.")
    entity: str = Field(description="Singular record noun used in tool names (item, ticket).")
    plural: str = Field(description="Plural noun (items, tickets).")
    key: str = Field("name", description="Field that identifies a record.")
    number: str = Field(description="The integer field that tasks change and compare.")
    text: str = Field(description="A string field that tasks look up.")
    keys: list[str] = Field(description="Record keys to draw from.")
    texts: list[str] = Field(description="Values to draw the string field from.")
    number_range: tuple[int, int] = Field((1, 50), description="Range of the integer field (low, high).")

    @model_validator(mode="after")
    def _range_has_room(self) -> "DomainBlueprint":
        low, high = self.number_range
        if high - low < 1:
            raise ValueError(f"number_range ({low}, {high}): needs low < high (tasks change the value within it)")
        return self


BLUEPRINTS: dict[str, DomainBlueprint] = {
    bp.domain: bp
    for bp in (
        DomainBlueprint(
            domain="inventory",
            description="a warehouse inventory",
            entity="item",
            plural="items",
            number="quantity",
            text="location",
            number_range=(0, 60),
            keys=["bolts", "nuts", "washers", "hinges", "cables", "fuses", "tape", "gloves", "ladders", "drills"],
            texts=["aisle 1", "aisle 2", "aisle 3", "back room", "loading dock"],
        ),
        DomainBlueprint(
            domain="tickets",
            description="a support-ticket queue",
            entity="ticket",
            plural="tickets",
            key="title",
            number="priority",
            text="assignee",
            number_range=(1, 5),
            keys=[
                "login fails",
                "slow search",
                "broken link",
                "missing invoice",
                "app crash",
                "wrong total",
                "email bounce",
                "sync error",
            ],
            texts=["ana", "ben", "chen", "dara", "eli"],
        ),
        DomainBlueprint(
            domain="recipes",
            description="a recipe box",
            entity="recipe",
            plural="recipes",
            key="title",
            number="servings",
            text="cuisine",
            number_range=(1, 12),
            keys=["pancakes", "lentil soup", "fried rice", "tacos", "risotto", "curry", "pesto pasta", "omelette"],
            texts=["french", "indian", "mexican", "italian", "chinese"],
        ),
    )
}


class RecordStoreState(ToolsetState):
    """Records by key (each a dict of the blueprint's fields)."""

    toolset: str = Field(description="The domain this state belongs to.")
    records: dict[str, dict[str, Any]] = Field(default_factory=dict, description="Key -> fields.")


def tool_names(bp: DomainBlueprint) -> dict[str, str]:
    """Operation -> tool name for a blueprint."""
    return {
        "list": f"list_{bp.plural}",
        "get": f"get_{bp.entity}",
        "add": f"add_{bp.entity}",
        "set": f"set_{bp.entity}_{bp.number}",
        "remove": f"remove_{bp.entity}",
    }


def blueprint_specs(bp: DomainBlueprint) -> tuple[ToolSpec, ...]:
    """The five MCP-style tools of a blueprint."""
    names, key = tool_names(bp), {bp.key: {"type": "string", "description": f"The {bp.entity}'s {bp.key}."}}
    low, high = bp.number_range  # the schema's bounds are the blueprint's own (a negative range included)
    number = {bp.number: {"type": "integer", "minimum": low, "maximum": high, "description": f"The {bp.number}."}}
    text = {bp.text: {"type": "string", "description": f"The {bp.text}."}}
    return (
        tool_spec(names["list"], f"List every {bp.entity} with its fields (JSON).", {}, []),
        tool_spec(names["get"], f"One {bp.entity}'s fields (JSON).", key, [bp.key]),
        tool_spec(names["add"], f"Add a new {bp.entity}.", {**key, **number, **text}, [bp.key, bp.number, bp.text]),
        tool_spec(
            names["set"], f"Set the {bp.number} of an existing {bp.entity}.", {**key, **number}, [bp.key, bp.number]
        ),
        tool_spec(names["remove"], f"Delete an {bp.entity}.", key, [bp.key]),
    )


class RecordStoreToolset(Toolset):
    """Rule-based simulator of a blueprint's tools over a RecordStoreState."""

    state_cls = RecordStoreState

    def __init__(self, blueprint: DomainBlueprint):
        self.blueprint = blueprint
        self.name = blueprint.domain  # type: ignore[misc]
        self.description = blueprint.description  # type: ignore[misc]
        self.context = f"Records are identified by their {blueprint.key}."  # type: ignore[misc]
        self.specs = blueprint_specs(blueprint)  # type: ignore[misc]
        self._ops = {name: op for op, name in tool_names(blueprint).items()}

    def __getattr__(self, attr: str) -> Callable[..., str]:
        op = self.__dict__.get("_ops", {}).get(attr.removeprefix("tool_")) if attr.startswith("tool_") else None
        if op is None:
            raise AttributeError(attr)
        return lambda state, **args: getattr(self, f"_op_{op}")(state, **args)

    def _record(self, state: RecordStoreState, key: str) -> dict[str, Any]:
        found = next((k for k in state.records if k.casefold() == key.strip().casefold()), None)
        if found is None:
            raise ToolError(f"no {self.blueprint.entity} with {self.blueprint.key} {key!r}")
        return state.records[found]

    def _op_list(self, state: RecordStoreState) -> str:
        rows = [{self.blueprint.key: k, **v} for k, v in sorted(state.records.items())]
        return json.dumps(rows, ensure_ascii=False)

    def _op_get(self, state: RecordStoreState, **args: Any) -> str:
        key = args[self.blueprint.key]
        return json.dumps({self.blueprint.key: key.strip(), **self._record(state, key)}, ensure_ascii=False)

    def _op_add(self, state: RecordStoreState, **args: Any) -> str:
        bp, key = self.blueprint, args[self.blueprint.key].strip()
        if any(k.casefold() == key.casefold() for k in state.records):
            raise ToolError(f"a {bp.entity} with {bp.key} {key!r} already exists")
        state.records = {**state.records, key: {bp.number: int(args[bp.number]), bp.text: args[bp.text]}}
        return f"Added {bp.entity} {key!r}."

    def _op_set(self, state: RecordStoreState, **args: Any) -> str:
        bp = self.blueprint
        self._record(state, args[bp.key])[bp.number] = int(args[bp.number])
        state.records = dict(state.records)
        return f"Set {bp.number} of {args[bp.key].strip()!r} to {int(args[bp.number])}."

    def _op_remove(self, state: RecordStoreState, **args: Any) -> str:
        bp, key = self.blueprint, args[self.blueprint.key]
        self._record(state, key)
        state.records = {k: v for k, v in state.records.items() if k.casefold() != key.strip().casefold()}
        return f"Removed {bp.entity} {key.strip()!r}."


# ------------------------------------------------------------------------------ task templates


def _initial(bp: DomainBlueprint, rng: random.Random, count: int) -> dict[str, dict[str, Any]]:
    keys = rng.sample(bp.keys, count)
    return {k: {bp.number: rng.randint(*bp.number_range), bp.text: rng.choice(bp.texts)} for k in sorted(keys)}


def _state(bp: DomainBlueprint, records: dict[str, dict[str, Any]], rng: random.Random) -> dict[str, Any]:
    return RecordStoreState(toolset=bp.domain, records=records, seed=rng.randrange(10**6)).model_dump(mode="json")


def _add_and_count(bp: DomainBlueprint, rng: random.Random) -> Scenario:
    records = _initial(bp, rng, rng.randint(2, 5))
    new_key = rng.choice([k for k in bp.keys if k not in records])
    fields = {bp.number: rng.randint(*bp.number_range), bp.text: rng.choice(bp.texts)}
    names = tool_names(bp)
    add = {bp.key: new_key, **fields}
    return Scenario(
        toolset=bp.domain,
        template=f"{bp.domain}_add_count",
        prompt=f"Add a {bp.entity} called {new_key!r} with {bp.number} {fields[bp.number]} and {bp.text} "
        f"{fields[bp.text]!r}, then tell me how many {bp.plural} there are in total.",
        initial_state=_state(bp, records, rng),
        success=[expect(["records", new_key], "equals", fields, f"the new {bp.entity} exists")],
        checkpoints=[Checkpoint(id="added", calls=[called(names["add"], **add)])],
        answer=[[str(len(records) + 1)]],
        reference_turns=[[ref_call(names["add"], **add)], [ref_call(names["list"])]],
        reference_answer=f"Added {new_key!r}. There are now {len(records) + 1} {bp.plural}.",
    )


def _set_number(bp: DomainBlueprint, rng: random.Random) -> Scenario:
    records = _initial(bp, rng, rng.randint(2, 5))
    key = rng.choice(sorted(records))
    value = rng.choice([v for v in range(bp.number_range[0], bp.number_range[1] + 1) if v != records[key][bp.number]])
    names, expected = tool_names(bp), {**records[key], bp.number: value}
    return Scenario(
        toolset=bp.domain,
        template=f"{bp.domain}_set_{bp.number}",
        prompt=f"Change the {bp.number} of {key!r} to {value} and confirm the new value.",
        initial_state=_state(bp, records, rng),
        success=[expect(["records", key], "equals", expected, f"{bp.number} updated, nothing else")],
        checkpoints=[Checkpoint(id="set", calls=[called(names["set"], **{bp.key: key, bp.number: value})])],
        answer=[[str(value)]],
        reference_turns=[[ref_call(names["set"], **{bp.key: key, bp.number: value})]],
        reference_answer=f"The {bp.number} of {key!r} is now {value}.",
    )


def _remove_below(bp: DomainBlueprint, rng: random.Random) -> Scenario:
    records = _initial(bp, rng, rng.randint(3, 6))
    values = sorted({r[bp.number] for r in records.values()})
    threshold = values[len(values) // 2] if len(values) > 1 else values[0] + 1
    doomed = sorted(k for k, r in records.items() if r[bp.number] < threshold)
    names = tool_names(bp)
    kept = {k: v for k, v in records.items() if k not in doomed}
    return Scenario(
        toolset=bp.domain,
        template=f"{bp.domain}_remove_below",
        prompt=f"Remove every {bp.entity} whose {bp.number} is below {threshold} and tell me which ones you removed.",
        initial_state=_state(bp, records, rng),
        success=[expect(["records"], "equals", kept, f"exactly the {bp.plural} below {threshold} are gone")],
        checkpoints=[Checkpoint(id="listed", calls=[called(names["list"])], before=called(names["remove"]))]
        if doomed
        else [],
        answer=[[k] for k in doomed] or [["none"]],
        reference_turns=[[ref_call(names["list"])]]
        + ([[ref_call(names["remove"], **{bp.key: k}) for k in doomed]] if doomed else []),
        reference_answer=(
            f"I removed {', '.join(doomed)}." if doomed else f"None: no {bp.entity} is below {threshold}."
        ),
    )


def _look_up(bp: DomainBlueprint, rng: random.Random) -> Scenario:
    records = _initial(bp, rng, rng.randint(2, 6))
    key = rng.choice(sorted(records))
    names = tool_names(bp)
    return Scenario(
        toolset=bp.domain,
        template=f"{bp.domain}_look_up",
        prompt=f"What is the {bp.text} of {key!r}?",
        initial_state=_state(bp, records, rng),
        success=[expect(["records"], "equals", records, "nothing changed")],
        checkpoints=[Checkpoint(id="looked_up", calls=[called(names["get"], **{bp.key: key}), called(names["list"])])],
        answer=[[records[key][bp.text]]],
        wrong_answers=[text for text in bp.texts if text != records[key][bp.text]],
        reference_turns=[[ref_call(names["get"], **{bp.key: key})]],
        reference_answer=f"The {bp.text} of {key!r} is {records[key][bp.text]}.",
    )


def record_templates(bp: DomainBlueprint) -> dict[str, Callable[[random.Random], Scenario]]:
    """Template name -> Scenario maker for a blueprint's domain."""
    makers = (_add_and_count, _set_number, _remove_below, _look_up)
    templates = {}
    for maker in makers:
        name = maker(bp, random.Random(0)).template
        templates[name] = (lambda m: lambda rng: m(bp, rng))(maker)
    return templates
