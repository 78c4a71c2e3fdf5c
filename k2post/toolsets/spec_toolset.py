"""A stateful, schema-driven simulator for the tools of any MCP spec (offline: no LLM).

Each tool gets a `ToolPlan` from its name, schemas and MCP `annotations`: its kind (the first word of
the name: create/add..., get/read..., list/search..., update/set..., delete/remove...; anything else is
an `action`), the collection of records it acts on (the rest of the name, singular: `get_ticket` and
`list_tickets` share `ticket`) and the argument that names a record (`id`, `*_id`, `name`, ... of the
collection's tools; absent: the whole argument object is the key). A `SpecState` keeps the records:

- read / action: the record named by the arguments; one nobody created is made up on first use
  (seeded by the state's seed and the key) and remembered, so asking twice gives the same answer;
  in a collection that has a create tool, an unknown record is an error;
- create: a new record from the arguments (a generated id when the key is not an argument);
- update: the record's fields set from the arguments; delete: the record removed;
- list: the collection's records, filtered by arguments that are record fields.

Every answer is valid against the tool's `outputSchema` (`schema_values.conform`: the record's fields
plus sampled ones); a tool without one answers with the record as JSON, which for reads and actions
gains a field named after the collection (`get_weather` -> `weather`). Arguments are checked against
the inputSchema first (`Error: ...` strings, as for every toolset).

    toolset = SpecToolset("weather", "weather service", tools, output_schemas={})
    state = toolset.new_state(toolset="weather", seed=1)
    toolset.call(state, "get_weather", {"city": "Paris"})   # '{"city": "Paris", "weather": "cedar-41"}'
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from k2post.chat.types import ToolSpec, dump_json
from k2post.toolsets.base import ToolError, Toolset, ToolsetState
from k2post.toolsets.schema_values import conform, schema_kind

ToolKind = Literal["create", "read", "list", "update", "delete", "action"]
VERB_KINDS: dict[str, ToolKind] = {
    **dict.fromkeys(("create", "add", "new", "insert", "register", "book", "make", "post", "submit"), "create"),
    **dict.fromkeys(("get", "read", "fetch", "lookup", "show", "describe", "view", "retrieve", "open"), "read"),
    **dict.fromkeys(("list", "search", "query", "browse", "find"), "list"),
    **dict.fromkeys(("update", "set", "edit", "modify", "change", "rename", "patch"), "update"),
    **dict.fromkeys(("delete", "remove", "cancel", "drop", "archive"), "delete"),
}  # fmt: skip
KEY_NAMES = ("id", "key", "name", "title", "slug", "code", "username", "email", "path")
NUMERIC_WORDS = ("count", "number", "total", "price", "amount", "temperature", "balance", "score", "age", "size")


class SpecState(ToolsetState):
    """The records of a spec domain: collection -> record key -> fields."""

    toolset: str = Field(description="The domain this state belongs to.")
    collections: dict[str, dict[str, dict[str, Any]]] = Field(
        default_factory=dict, description="Collection -> record key -> the record's fields."
    )
    next_id: int = Field(1, ge=1, description="The next generated record id.")


@dataclass(frozen=True)
class ToolPlan:
    """How the simulator treats one tool."""

    spec: ToolSpec
    kind: ToolKind
    collection: str
    key: str | None
    output_schema: dict[str, Any]
    declared_output: bool


def name_words(name: str) -> list[str]:
    """`getWeather`, `get_weather`, `get-weather` -> ['get', 'weather']."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name)
    return [word for word in re.split(r"[_\-\s]+", spaced.lower()) if word]


def singular(word: str) -> str:
    """A plural noun's singular (tickets -> ticket, entries -> entry); others unchanged."""
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith("s") and not word.endswith(("ss", "us", "is")) and len(word) > 3:
        return word[:-1]
    return word


def tool_kind(name: str, annotations: dict[str, Any] | None = None) -> tuple[ToolKind, str]:
    """(kind, collection) of a tool from its name; a `readOnlyHint` tool never writes."""
    words = name_words(name) or [name]
    kind = VERB_KINDS.get(words[0], "action")
    if kind == "action":
        return "action", name
    if (annotations or {}).get("readOnlyHint") is True and kind in ("create", "update", "delete"):
        return "action", name
    noun = "_".join(words[1:-1] + [singular(words[-1])]) if len(words) > 1 else name
    return kind, noun


def is_scalar_key(schema: Any) -> bool:
    """Whether a property can name a record (a string or an integer)."""
    return isinstance(schema, dict) and schema_kind(schema) in ("string", "integer") and "enum" not in schema


def _key_rank(prop: str, collection: str) -> int:
    lowered = prop.lower()
    if lowered in ("id", f"{collection}_id"):
        return 0
    if lowered.endswith("_id") or lowered.endswith("id"):
        return 1
    return 2 + next((i for i, word in enumerate(KEY_NAMES) if lowered.endswith(word)), len(KEY_NAMES))


def collection_key(specs: list[ToolSpec], collection: str) -> str | None:
    """The argument that names a record: the best-ranked required scalar property of the
    collection's tools (ids first, then names, then the first one)."""
    candidates: list[str] = []
    for spec in specs:
        properties = spec.parameters.get("properties") or {}
        candidates += [p for p in spec.parameters.get("required") or [] if is_scalar_key(properties.get(p))]
    if not candidates:
        return None
    return min(dict.fromkeys(candidates), key=lambda prop: (_key_rank(prop, collection), candidates.index(prop)))


def _noun_schema(noun: str) -> dict[str, Any]:
    """The schema of the made-up field named after a collection (`weather`, `current_time`)."""
    words = noun.split("_")
    if any(word in ("time", "date", "datetime") for word in words):
        return {"type": "string", "format": "date-time"}
    if any(word in NUMERIC_WORDS for word in words):
        return {"type": "number", "minimum": 0, "maximum": 1000}
    return {"type": "string"}


def default_output_schema(spec: ToolSpec, kind: ToolKind, collection: str, key: str | None) -> dict[str, Any]:
    """What a tool without an outputSchema answers: the record (its arguments, the key, and for reads
    and actions a field named after the collection)."""
    properties = dict(spec.parameters.get("properties") or {})
    if key and key not in properties:
        properties[key] = {"type": "string"}
    if kind in ("read", "action"):
        properties.setdefault(collection.removesuffix("()"), _noun_schema(collection))
    return {"type": "object", "properties": properties}


def plan_tools(
    tools: list[ToolSpec], output_schemas: dict[str, dict[str, Any]], annotations: dict[str, dict[str, Any]]
) -> dict[str, ToolPlan]:
    """Name -> ToolPlan for every tool of a domain."""
    kinds = {tool.name: tool_kind(tool.name, annotations.get(tool.name)) for tool in tools}
    plans = {}
    for tool in tools:
        kind, collection = kinds[tool.name]
        family = [t for t in tools if kinds[t.name][1] == collection]
        keyed = [t for t in family if kinds[t.name][0] in ("read", "update", "delete")] or family
        key = collection_key(keyed, collection) if kind != "action" else None
        declared = output_schemas.get(tool.name)
        output = declared if isinstance(declared, dict) else default_output_schema(tool, kind, collection, key)
        plans[tool.name] = ToolPlan(tool, kind, collection, key, output, isinstance(declared, dict))
    return plans


def record_key(plan: ToolPlan, arguments: dict[str, Any]) -> str:
    """The key a call's record is stored under (the key argument, case-folded; else all arguments)."""
    if plan.key is not None and plan.key in arguments:
        return str(arguments[plan.key]).strip().casefold()
    return dump_json(dict(sorted(arguments.items())))


def render(value: Any) -> str:
    """A tool result as text: strings as they are, everything else as JSON."""
    return value if isinstance(value, str) else dump_json(value)


def _matches(record: dict[str, Any], filters: dict[str, Any]) -> bool:
    """Whether a record has every filter's value (strings case-insensitively)."""
    for name, wanted in filters.items():
        have = record.get(name)
        if isinstance(wanted, str) and isinstance(have, str):
            if wanted.strip().casefold() != have.strip().casefold():
                return False
        elif have != wanted:
            return False
    return True


def _array_property(schema: dict[str, Any]) -> str | None:
    """The first array-valued property of an object schema (where a list tool puts its rows)."""
    properties = schema.get("properties") or {}
    return next((k for k, v in properties.items() if isinstance(v, dict) and schema_kind(v) == "array"), None)


class SpecToolset(Toolset):
    """The schema-driven simulator of one spec domain (see the module docstring)."""

    state_cls = SpecState

    def __init__(
        self,
        domain: str,
        description: str,
        tools: list[ToolSpec],
        output_schemas: dict[str, dict[str, Any]] | None = None,
        annotations: dict[str, dict[str, Any]] | None = None,
    ):
        self.name = domain  # type: ignore[misc]
        self.description = description or f"a {domain.replace('_', ' ')} service"  # type: ignore[misc]
        self.context = "Use only what the tools return."  # type: ignore[misc]
        self.specs = tuple(tools)  # type: ignore[misc]
        self.annotations = dict(annotations or {})
        self.plans = plan_tools(tools, output_schemas or {}, self.annotations)

    def __getattr__(self, attr: str) -> Callable[..., str]:
        plan = self.__dict__.get("plans", {}).get(attr.removeprefix("tool_")) if attr.startswith("tool_") else None
        if plan is None:
            raise AttributeError(attr)
        return lambda state, **arguments: render(self.run(plan, state, arguments))

    def output_schemas(self) -> dict[str, dict[str, Any]]:
        return {name: plan.output_schema for name, plan in self.plans.items() if plan.declared_output}

    def tool_annotations(self) -> dict[str, dict[str, Any]]:
        return dict(self.annotations)

    def has_creator(self, collection: str) -> bool:
        """Whether some tool creates records of `collection` (then unknown records are errors)."""
        return any(p.kind == "create" and p.collection == collection for p in self.plans.values())

    def record_schema(self, collection: str) -> dict[str, Any]:
        """Every field the collection's tools take or return, as one object schema."""
        properties: dict[str, Any] = {}
        for plan in self.plans.values():
            if plan.collection == collection and plan.kind != "list":
                properties.update(plan.spec.parameters.get("properties") or {})
                if plan.kind == "read" and schema_kind(plan.output_schema) == "object":
                    properties.update(plan.output_schema.get("properties") or {})
        return {"type": "object", "properties": properties}

    def run(self, plan: ToolPlan, state: SpecState, arguments: dict[str, Any]) -> Any:
        """One call's result value (before rendering); ToolError for domain errors."""
        handlers = {
            "read": self._read,
            "action": self._read,
            "list": self._list,
            "create": self._create,
            "update": self._update,
            "delete": self._delete,
        }
        return handlers[plan.kind](plan, state, arguments)

    @staticmethod
    def _rng(state: SpecState, plan: ToolPlan, key: str) -> random.Random:
        """Randomness of one record's made-up fields: fixed by the state's seed, the tool and the key."""
        return random.Random(f"{state.seed}:{plan.spec.name}:{plan.collection}:{key}")

    def _answer(self, plan: ToolPlan, state: SpecState, key: str, record: dict[str, Any]) -> Any:
        """The tool's answer for a record; what it made up is remembered in the record."""
        records = state.collections.setdefault(plan.collection, {})
        remembered = f"@{plan.spec.name}"
        if schema_kind(plan.output_schema) != "object" and remembered in record:
            return record[remembered]
        value = conform(record, plan.output_schema, self._rng(state, plan, key))
        kept = {k: v for k, v in record.items() if k != remembered}
        records[key] = {**kept, **value} if isinstance(value, dict) else {**kept, remembered: value}
        return value

    def _missing(self, plan: ToolPlan, arguments: dict[str, Any]) -> ToolError:
        noun = plan.collection.replace("_", " ")
        named = f" with {plan.key} {arguments[plan.key]!r}" if plan.key in arguments else ""
        return ToolError(f"no {noun}{named}")

    def _read(self, plan: ToolPlan, state: SpecState, arguments: dict[str, Any]) -> Any:
        key = record_key(plan, arguments)
        record = state.collections.get(plan.collection, {}).get(key)
        if record is None:
            if self.has_creator(plan.collection) and plan.key is not None:
                raise self._missing(plan, arguments)
            record = {}
        return self._answer(plan, state, key, {**record, **arguments})

    def _list(self, plan: ToolPlan, state: SpecState, arguments: dict[str, Any]) -> Any:
        records = list(state.collections.get(plan.collection, {}).values())
        fields = {name for record in records for name in record}
        rows = [r for r in records if _matches(r, {k: v for k, v in arguments.items() if k in fields})]
        rows = [{k: v for k, v in row.items() if not k.startswith("@")} for row in rows]
        if not plan.declared_output:
            return rows
        schema, rng = plan.output_schema, self._rng(state, plan, record_key(plan, arguments))
        if schema_kind(schema) == "array":
            items = schema.get("items") if isinstance(schema.get("items"), dict) else {}
            return [conform(row, items, rng) for row in rows]
        holder = _array_property(schema)
        if holder is None:
            return conform({}, schema, rng)
        items = (schema["properties"][holder].get("items")) or {}
        return conform({holder: [conform(row, items, rng) for row in rows]}, schema, rng)

    def _new_key(self, plan: ToolPlan, state: SpecState) -> Any:
        """A generated id for a created record whose key is not an argument (int or `ticket-3`)."""
        number = state.next_id
        state.next_id += 1
        schema = self.record_schema(plan.collection)["properties"].get(plan.key or "id") or {}
        return number if schema_kind(schema) == "integer" else f"{plan.collection.replace('_', '-')}-{number}"

    def _create(self, plan: ToolPlan, state: SpecState, arguments: dict[str, Any]) -> Any:
        record = dict(arguments)
        if plan.key is not None and plan.key not in record:
            record[plan.key] = self._new_key(plan, state)
        key = record_key(plan, record)
        records = state.collections.setdefault(plan.collection, {})
        if key in records:
            raise ToolError(f"a {plan.collection.replace('_', ' ')} with {plan.key or 'these fields'} already exists")
        records[key] = record
        return self._answer(plan, state, key, record)

    def _update(self, plan: ToolPlan, state: SpecState, arguments: dict[str, Any]) -> Any:
        key = record_key(plan, arguments)
        record = state.collections.get(plan.collection, {}).get(key)
        if record is None and self.has_creator(plan.collection):
            raise self._missing(plan, arguments)
        updated = {**(record or {}), **arguments}
        state.collections.setdefault(plan.collection, {})[key] = updated
        return self._answer(plan, state, key, updated)

    def _delete(self, plan: ToolPlan, state: SpecState, arguments: dict[str, Any]) -> Any:
        key = record_key(plan, arguments)
        records = state.collections.get(plan.collection, {})
        if key not in records:
            raise self._missing(plan, arguments)
        del records[key]
        noun = plan.collection.replace("_", " ")
        if not plan.declared_output:
            return f"Deleted {noun} {arguments.get(plan.key, key) if plan.key else key}."
        return conform({**arguments, "deleted": True}, plan.output_schema, self._rng(state, plan, key))
