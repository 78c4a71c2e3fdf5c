"""Task templates for any spec domain: a Scenario per tool (and per create -> read pair), with its rubric.

A template seeds a `SpecState` (records of the tool's collection, made by the simulator itself), draws
arguments from the tool's inputSchema, runs the reference calls on the simulator, and derives the
rubric from what they did: success checks on every record the reference touched (equal to its final
value, or absent after a delete), one checkpoint per reference call (a create -> read pair in order),
and, where the last answer has one, a fact the final answer must mention (a field the arguments did
not give, a list's count, a generated id). A template whose reference call fails on every draw (an
inputSchema whose `pattern` the generator cannot meet, say) is left out. A tool whose input or output schema has
a `pattern` the value generator cannot meet (schema_values.unsatisfiable_patterns) is left out up front, with one
warning line naming the tool and the field (its simulated answers could not be valid).

    templates = spec_templates(toolset)                     # name -> fn(rng) -> Scenario
    scenario = templates["helpdesk_get_ticket"](random.Random(0))
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from k2post.chat.types import dump_json
from k2post.toolsets.base import is_error
from k2post.toolsets.checks import Checkpoint, Scenario, StateCheck, called, count_alternatives, expect, ref_call
from k2post.toolsets.schema_values import sample_value, unsatisfiable_patterns
from k2post.toolsets.spec_toolset import SpecState, SpecToolset, ToolPlan, record_key

logger = logging.getLogger(__name__)
TemplateFn = Callable[[random.Random], Scenario]
DRAWS = 20
"""Argument draws a template tries before it gives up on a tool."""
MAX_FACT_CHARS = 60


class Unbuildable(RuntimeError):
    """A draw whose reference calls fail on the simulator."""


@dataclass
class Draft:
    """A scenario under construction: the calls, and what running them on the simulator gave."""

    calls: list[tuple[ToolPlan, dict[str, Any]]]
    outputs: list[Any] = field(default_factory=list)


def _words(name: str) -> str:
    return name.replace("_", " ").strip()


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) else dump_json(value)


def arguments_phrase(arguments: dict[str, Any]) -> str:
    """`city 'Paris' and unit 'celsius'`."""
    return " and ".join(f"{_words(name)} {_shown(value)}" for name, value in arguments.items())


def _required_arguments(plan: ToolPlan, rng: random.Random, skip: set[str]) -> dict[str, Any]:
    properties = plan.spec.parameters.get("properties") or {}
    required = [p for p in plan.spec.parameters.get("required") or [] if p in properties and p not in skip]
    return {name: sample_value(properties[name], rng, name) for name in required}


def seed_records(toolset: SpecToolset, state: SpecState, plan: ToolPlan, rng: random.Random) -> list[dict[str, Any]]:
    """2-4 records of the plan's collection, made from the collection's fields (keys distinct)."""
    schema = toolset.record_schema(plan.collection)
    key_schema = schema["properties"].get(plan.key or "", {"type": "string"})
    records = state.collections.setdefault(plan.collection, {})
    for _ in range(rng.randint(2, 4)):
        record = sample_value(schema, rng, complete=True)
        if plan.key is not None:
            record[plan.key] = sample_value(key_schema, rng, plan.key)
        records.setdefault(record_key(plan, record), record)
    return list(records.values())


def run_reference(toolset: SpecToolset, state: SpecState, draft: Draft) -> SpecState:
    """The state after the draft's calls (a copy); Unbuildable if a call fails."""
    final = state.model_copy(deep=True)
    for plan, arguments in draft.calls:
        result = toolset.call(final, plan.spec.name, arguments)
        if is_error(result):
            raise Unbuildable(result)
        draft.outputs.append(decoded(result))
    return final


def decoded(result: str) -> Any:
    """A tool result's JSON value (plain text stays text)."""
    try:
        return json.loads(result)
    except ValueError:
        return result


def touched_checks(draft: Draft, initial: SpecState, final: SpecState) -> list[StateCheck]:
    """A success check per record the reference calls touched: its final value, or absent."""
    checks = []
    for plan, arguments in draft.calls:
        key = record_key(plan, arguments)
        if plan.kind == "create":
            before = set(initial.collections.get(plan.collection, {}))
            key = next((k for k in final.collections.get(plan.collection, {}) if k not in before), key)
        path: list[str | int] = ["collections", plan.collection, key]
        record = final.collections.get(plan.collection, {}).get(key)
        check = expect(path, "absent", None, "deleted") if record is None else expect(path, "equals", record)
        if plan.kind != "list" and check not in checks:
            checks.append(check)
    return checks


def _fact(output: Any, arguments: dict[str, Any], preferred: str) -> tuple[str, str] | None:
    """(field, value) of an answer worth asking for: a short scalar the arguments did not give."""
    if isinstance(output, (str, int, float)) and not isinstance(output, bool):
        return (preferred, str(output)) if 0 < len(str(output)) <= MAX_FACT_CHARS else None
    if not isinstance(output, dict):
        return None
    given = {str(v).casefold() for v in arguments.values()}
    facts = [
        (name, str(value))
        for name, value in output.items()
        if isinstance(value, (str, int, float))
        and not isinstance(value, bool)
        and name not in arguments
        and 0 < len(str(value)) <= MAX_FACT_CHARS
        and str(value).casefold() not in given
    ]
    return next((f for f in facts if f[0] == preferred), facts[0] if facts else None)


def _answers(value: str) -> list[str]:
    """Ways a number may be written: `41.0` also as `41`."""
    try:
        number = float(value)
    except ValueError:
        return [value]
    return [value, str(int(number))] if number.is_integer() and value != str(int(number)) else [value]


def _checkpoints(draft: Draft) -> list[Checkpoint]:
    points = []
    for position, (plan, arguments) in enumerate(draft.calls):
        after = called(draft.calls[position - 1][0].spec.name) if position else None
        pattern = called(plan.spec.name, **arguments)
        points.append(Checkpoint(id=f"call_{position}_{plan.spec.name}", calls=[pattern], after=after))
    return points


def _rows(output: Any) -> list[Any] | None:
    """The rows of a list tool's answer (the answer, or its first array field)."""
    if isinstance(output, list):
        return output
    if isinstance(output, dict):
        return next((value for value in output.values() if isinstance(value, list)), None)
    return None


def _ask(
    plan: ToolPlan, arguments: dict[str, Any], output: Any, known: dict[str, Any] | None
) -> tuple[str, list[list[str]], str]:
    """(request, answer groups, reference answer) for the last call of a draft; `known`: it reads back
    what the call before it created with these arguments (None: a single call)."""
    chained = known is not None
    noun, given = _words(plan.collection), arguments_phrase(arguments)
    if plan.kind == "list":
        count = len(_rows(output) or [])
        where = f" with {given}" if given else ""
        return f"how many {noun} records are there{where}?", [count_alternatives(count)], f"There are {count}."
    preferred = plan.key if plan.kind == "create" and plan.key else plan.collection
    fact = _fact(output, {} if plan.kind == "create" else {**(known or {}), **arguments}, preferred)
    rows = _rows(output) if plan.kind in ("read", "action") else None
    if fact is None and rows is not None and not chained:
        where = f" for {given}" if given else ""
        count = len(rows)
        return f"how many {noun} records are there{where}?", [count_alternatives(count)], f"There are {count}."
    if plan.kind in ("update", "delete") or fact is None:
        what = {"update": "update", "delete": "delete", "create": "create"}.get(plan.kind, f"use {plan.spec.name} on")
        subject = f" with {given}" if given else ""
        return f"{what} the {noun}{subject}, then tell me it is done.", [], "Done."
    field_name = _words(fact[0])
    reference = f"The {field_name} is {fact[1]}."
    if chained:
        return f"then look it up and tell me its {field_name}.", [_answers(fact[1])], reference
    if plan.kind == "create":
        return f"create a {noun} with {given}, then tell me its {field_name}.", [_answers(fact[1])], reference
    what = "the result" if fact[0] == plan.collection and plan.kind == "action" else f"the {field_name}"
    verb = f"use {plan.spec.name}" if plan.kind == "action" else f"look up the {noun}"
    subject = f" with {given}" if given else ""
    return f"{verb}{subject} and tell me {what}.", [_answers(fact[1])], reference


def build_scenario(toolset: SpecToolset, template: str, state: SpecState, draft: Draft) -> Scenario:
    """Run the draft on the simulator and derive the prompt and rubric from what it did."""
    final = run_reference(toolset, state, draft)
    first, first_arguments = draft.calls[0]
    plan, arguments = draft.calls[-1]
    chained = len(draft.calls) > 1
    request, answer, reference = _ask(plan, arguments, draft.outputs[-1], first_arguments if chained else None)
    if chained:
        request = f"create a {_words(first.collection)} with {arguments_phrase(first_arguments)}, {request}"
    return Scenario(
        toolset=toolset.name,
        template=template,
        prompt=f"Using the {_words(toolset.name)} tools: {request}",
        initial_state=state.model_dump(mode="json"),
        success=touched_checks(draft, state, final),
        checkpoints=_checkpoints(draft),
        answer=answer,
        reference_turns=[[ref_call(p.spec.name, **a)] for p, a in draft.calls],
        reference_answer=reference,
    )


def _arguments(toolset: SpecToolset, state: SpecState, plan: ToolPlan, rng: random.Random) -> dict[str, Any]:
    """Arguments for one call of `plan`: a seeded record's key where the record must exist."""
    arguments = _required_arguments(plan, rng, skip={plan.key} if plan.key else set())
    if plan.kind == "create" or plan.key is None:
        return _required_arguments(plan, rng, set()) if plan.key is not None else arguments
    properties = plan.spec.parameters.get("properties") or {}
    if plan.kind in ("update", "delete", "list") or toolset.has_creator(plan.collection):
        target = rng.choice(seed_records(toolset, state, plan, rng))
        if plan.kind == "list":
            return {k: target[k] for k in properties if k in target and rng.random() < 0.5} | arguments
        arguments = {plan.key: target[plan.key], **arguments}
    elif plan.key in properties:
        arguments = {plan.key: sample_value(properties[plan.key], rng, plan.key), **arguments}
    if plan.kind == "update" and set(arguments) <= {plan.key}:
        optional = [p for p in properties if p != plan.key]
        if not optional:
            raise Unbuildable(f"{plan.spec.name}: nothing to update")
        arguments[optional[0]] = sample_value(properties[optional[0]], rng, optional[0])
    return arguments


def _reader_arguments(reader: ToolPlan, final: SpecState, created_key: str) -> dict[str, Any]:
    record = final.collections[reader.collection][created_key]
    return {reader.key: record[reader.key]} if reader.key and reader.key in record else {}


def _single(toolset: SpecToolset, plan: ToolPlan, template: str) -> TemplateFn:
    def make(rng: random.Random) -> Scenario:
        state = toolset.new_state(toolset=toolset.name, seed=rng.randrange(10**6))
        return build_scenario(toolset, template, state, Draft([(plan, _arguments(toolset, state, plan, rng))]))

    return make


def _chain(toolset: SpecToolset, creator: ToolPlan, reader: ToolPlan, template: str) -> TemplateFn:
    def make(rng: random.Random) -> Scenario:
        state = toolset.new_state(toolset=toolset.name, seed=rng.randrange(10**6))
        arguments = _arguments(toolset, state, creator, rng)
        after = run_reference(toolset, state, Draft([(creator, arguments)]))
        new_key = next(
            k for k in after.collections[creator.collection] if k not in state.collections.get(creator.collection, {})
        )
        second = _reader_arguments(reader, after, new_key)
        return build_scenario(toolset, template, state, Draft([(creator, arguments), (reader, second)]))

    return make


def _retrying(make: TemplateFn, name: str) -> TemplateFn:
    """`make` tried on up to DRAWS derived RNGs (a draw may be unbuildable)."""

    def template(rng: random.Random) -> Scenario:
        seed = rng.randrange(2**32)
        for draw in range(DRAWS):
            try:
                return make(random.Random(f"{seed}:{draw}"))
            except Unbuildable:
                continue
        raise Unbuildable(f"{name}: no draw of {DRAWS} gave a reference solution that runs")

    return template


def meetable(toolset: SpecToolset, plan: ToolPlan) -> bool:
    """Whether the generator meets every `pattern` of the tool's schemas; if not, one warning line says which."""
    name = plan.spec.name
    problems = unsatisfiable_patterns(plan.spec.parameters, f"{name}.input")
    problems += unsatisfiable_patterns(plan.output_schema, f"{name}.output")
    if problems:
        logger.warning(
            "k2post: warning: tool spec %s: no tasks for tool %s: the value generator cannot meet %s",
            toolset.name,
            name,
            "; ".join(problems),
        )
    return not problems


def spec_templates(toolset: SpecToolset) -> dict[str, TemplateFn]:
    """Template name -> Scenario maker, for every tool that gets a working task (and each create ->
    read pair of a collection); tools whose tasks never build are left out."""
    makers: dict[str, TemplateFn] = {}
    plans = [plan for plan in toolset.plans.values() if meetable(toolset, plan)]
    for plan in plans:
        makers[f"{toolset.name}_{plan.spec.name}"] = _single(toolset, plan, f"{toolset.name}_{plan.spec.name}")
        readers = [p for p in plans if p.kind == "read" and p.collection == plan.collection and p.key]
        if plan.kind == "create" and readers:
            name = f"{toolset.name}_{plan.spec.name}_then_{readers[0].spec.name}"
            makers[name] = _chain(toolset, plan, readers[0], name)
    working = {}
    for name, make in makers.items():
        template = _retrying(make, name)
        try:
            template(random.Random(0))
        except Unbuildable:
            continue
        working[name] = template
    return working
