"""Simulated toolsets: each tool's happy path and argument errors, schema checks, seeded
randomness, JSON round trips, and every template's reference solution passing its own checks."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import pytest

from k2post.toolsets import TEMPLATES, TOOLSETS, get_toolset, is_error, load_state
from k2post.toolsets.bank import BankState, money_alternatives
from k2post.toolsets.base import ToolsetState
from k2post.toolsets.calendar import CalendarState, Event, time_alternatives
from k2post.toolsets.checks import (
    CallPattern,
    Checkpoint,
    StateCheck,
    ToolCallRecord,
    answer_matches,
    check_checkpoint,
    check_state,
    stray_numbers,
    values_match,
)
from k2post.toolsets.filesystem import FileSystemState
from k2post.toolsets.schema import check_arguments


def fs_state() -> FileSystemState:
    return FileSystemState(files={"a.txt": "hello\nworld\n", "docs/b.md": "B"}, dirs=["docs"])


def calendar_state() -> CalendarState:
    standup = Event(
        id="evt-1",
        title="Standup",
        date="2025-03-04",
        start="09:00",
        duration_minutes=30,
        attendees=["Bob"],
    )
    return CalendarState(events=[standup], next_id=2)


def bank_state() -> BankState:
    return BankState(accounts={"checking": 10_000, "savings": 50_000})


STATES: dict[str, Callable[[], ToolsetState]] = {
    "filesystem": fs_state,
    "calendar": calendar_state,
    "bank": bank_state,
}

Check = Callable[[Any], bool]

HAPPY: list[tuple[str, str, dict[str, Any], str, Check]] = [
    ("filesystem", "list_dir", {}, "a.txt\ndocs/", lambda s: True),
    ("filesystem", "list_dir", {"path": "/docs/"}, "b.md", lambda s: True),
    ("filesystem", "read_file", {"path": "/a.txt"}, "hello\nworld", lambda s: True),
    (
        "filesystem",
        "write_file",
        {"path": "docs/c.txt", "content": "x"},
        "Wrote 1",
        lambda s: s.files["docs/c.txt"] == "x",
    ),
    (
        "filesystem",
        "delete_file",
        {"path": "./a.txt"},
        "Deleted a.txt",
        lambda s: "a.txt" not in s.files,
    ),
    ("filesystem", "make_dir", {"path": "docs/sub"}, "Created", lambda s: "docs/sub" in s.dirs),
    (
        "filesystem",
        "move",
        {"source": "a.txt", "destination": "docs/"},
        "docs/a.txt",
        lambda s: "docs/a.txt" in s.files,
    ),
    (
        "filesystem",
        "move",
        {"source": "a.txt", "destination": "c.txt"},
        "to c.txt",
        lambda s: set(s.files) == {"c.txt", "docs/b.md"},
    ),
    (
        "calendar",
        "list_events",
        {"date": "2025-03-04"},
        "evt-1 | 2025-03-04 09:00-09:30 | Standup",
        lambda s: True,
    ),
    ("calendar", "list_events", {"date": "2025-03-05"}, "No events", lambda s: True),
    (
        "calendar",
        "create_event",
        {
            "title": "Sync",
            "date": "2025-03-04",
            "start": "9:30",
            "duration_minutes": 30.0,
            "attendees": ["Ann"],
        },
        "Created evt-2",
        lambda s: s.events[-1].start == "09:30" and s.events[-1].duration_minutes == 30 and s.next_id == 3,
    ),
    ("calendar", "delete_event", {"event_id": "evt-1"}, "Deleted evt-1", lambda s: s.events == []),
    (
        "calendar",
        "find_free_slot",
        {"date": "2025-03-04", "duration_minutes": 60},
        "09:30-10:30",
        lambda s: True,
    ),
    (
        "calendar",
        "find_free_slot",
        {"date": "2025-03-04", "duration_minutes": 30, "after": "12:15"},
        "12:15-12:45",
        lambda s: True,
    ),
    ("bank", "list_accounts", {}, "checking: $100.00\nsavings: $500.00", lambda s: True),
    ("bank", "get_balance", {"account": "Savings"}, "savings: $500.00", lambda s: True),
    (
        "bank",
        "transfer",
        {"from_account": "checking", "to_account": "savings", "amount": 25},
        "Transferred $25.00",
        lambda s: s.accounts == {"checking": 7_500, "savings": 52_500} and len(s.transactions) == 2,
    ),
    (
        "bank",
        "pay",
        {"account": "checking", "payee": "City Water", "amount": 10.5},
        "Paid $10.50 to City Water",
        lambda s: s.accounts["checking"] == 8_950 and s.transactions[-1].kind == "payment",
    ),
    ("bank", "list_transactions", {"account": "checking"}, "No transactions", lambda s: True),
]


@pytest.mark.parametrize(("toolset", "tool", "arguments", "expected", "check"), HAPPY)
def test_tool_happy_path(toolset: str, tool: str, arguments: dict[str, Any], expected: str, check: Check) -> None:
    state = STATES[toolset]()
    result = get_toolset(toolset).call(state, tool, arguments)
    assert not is_error(result), result
    assert expected in result
    assert check(state)


ERRORS: list[tuple[str, str, Any, str]] = [
    ("filesystem", "read_file", {}, "read_file: missing required argument 'path'"),
    (
        "filesystem",
        "read_file",
        {"path": 3},
        "read_file: argument 'path' must be a string, got integer",
    ),
    (
        "filesystem",
        "read_file",
        {"path": "a.txt", "mode": "r"},
        "read_file: unexpected argument 'mode'",
    ),
    ("filesystem", "read_file", ["a.txt"], "read_file: arguments must be a JSON object"),
    ("filesystem", "read_file", {"path": ""}, "argument 'path' must have at least 1 characters"),
    ("filesystem", "read_file", {"path": "nope.txt"}, "read_file: no such file 'nope.txt'"),
    ("filesystem", "read_file", {"path": "docs"}, "is a directory"),
    ("filesystem", "read_file", {"path": "../etc/passwd"}, "leaves the root"),
    (
        "filesystem",
        "write_file",
        {"path": "zzz/c.txt", "content": ""},
        "directory 'zzz/' does not exist",
    ),
    (
        "filesystem",
        "write_file",
        {"path": "c.txt"},
        "write_file: missing required argument 'content'",
    ),
    ("filesystem", "move", {"source": "a.txt", "destination": "docs/b.md"}, "already exists"),
    ("filesystem", "move", {"source": "a.txt", "destination": "nodir/"}, "no such directory"),
    ("filesystem", "make_dir", {"path": "docs"}, "already exists"),
    ("filesystem", "rm", {"path": "a.txt"}, "unknown tool 'rm'"),
    (
        "calendar",
        "create_event",
        {"title": "X", "date": "2025-03-04", "start": "10:00"},
        "missing required argument 'duration_minutes'",
    ),
    (
        "calendar",
        "create_event",
        {"title": "X", "date": "2025-03-04", "start": "10:00", "duration_minutes": "30"},
        "argument 'duration_minutes' must be an integer, got string",
    ),
    (
        "calendar",
        "create_event",
        {
            "title": "X",
            "date": "2025-03-04",
            "start": "10:00",
            "duration_minutes": 30,
            "attendees": [1],
        },
        "argument 'attendees[0]' must be a string",
    ),
    (
        "calendar",
        "create_event",
        {"title": "X", "date": "2025-03-04", "start": "09:15", "duration_minutes": 30},
        "overlaps evt-1",
    ),
    (
        "calendar",
        "create_event",
        {"title": "X", "date": "2025-03-04", "start": "16:30", "duration_minutes": 60},
        "outside working hours",
    ),
    (
        "calendar",
        "create_event",
        {"title": "X", "date": "March 4", "start": "10:00", "duration_minutes": 30},
        "is not YYYY-MM-DD",
    ),
    (
        "calendar",
        "create_event",
        {"title": "X", "date": "2025-03-04", "start": "25:00", "duration_minutes": 30},
        "is not HH:MM",
    ),
    ("calendar", "delete_event", {"event_id": "evt-9"}, "delete_event: no event with id 'evt-9'"),
    (
        "calendar",
        "find_free_slot",
        {"date": "2025-03-04", "duration_minutes": 0},
        "argument 'duration_minutes' must be >= 5",
    ),
    (
        "bank",
        "transfer",
        {"from_account": "checking", "to_account": "savings", "amount": True},
        "argument 'amount' must be a number, got boolean",
    ),
    (
        "bank",
        "transfer",
        {"from_account": "checking", "to_account": "savings", "amount": 101},
        "insufficient funds in checking",
    ),
    (
        "bank",
        "transfer",
        {"from_account": "checking", "to_account": "savings", "amount": 1.234},
        "more than two decimals",
    ),
    (
        "bank",
        "transfer",
        {"from_account": "checking", "to_account": "checking", "amount": 1},
        "must differ",
    ),
    (
        "bank",
        "transfer",
        {"from_account": "checking", "to_account": "savings", "amount": -5},
        "argument 'amount' must be >= 0.01",
    ),
    ("bank", "get_balance", {"account": "brokerage"}, "no account 'brokerage'"),
    ("bank", "list_accounts", {"verbose": True}, "list_accounts: unexpected argument 'verbose'"),
    (
        "bank",
        "list_transactions",
        {"account": "checking", "limit": 2.5},
        "argument 'limit' must be an integer",
    ),
]


@pytest.mark.parametrize(("toolset", "tool", "arguments", "fragment"), ERRORS)
def test_tool_argument_errors(toolset: str, tool: str, arguments: Any, fragment: str) -> None:
    state = STATES[toolset]()
    before = state.model_dump()
    result = get_toolset(toolset).call(state, tool, arguments)
    assert result.startswith("Error: ") and fragment in result, result
    assert state.model_dump() == before  # a rejected call changes nothing


@pytest.mark.parametrize(
    ("schema", "arguments", "fragment"),
    [
        ({"type": "object", "properties": {"n": {"type": "integer"}}}, {"n": 3.0}, None),
        (
            {"type": "object", "properties": {"n": {"type": "integer"}}},
            {"n": True},
            "must be an integer, got boolean",
        ),
        (
            {"type": "object", "properties": {"n": {"type": "number"}}},
            {"n": None},
            "must be a number, got null",
        ),
        (
            {"type": "object", "properties": {"c": {"enum": ["a", "b"]}}},
            {"c": "z"},
            "must be one of 'a', 'b'",
        ),
        (
            {"type": "object", "properties": {"s": {"type": "string", "pattern": "^x"}}},
            {"s": "y"},
            "must match",
        ),
        (
            {"type": "object", "properties": {"o": {"type": "object", "required": ["k"]}}},
            {"o": {}},
            "missing required argument 'o.k'",
        ),
        (
            {"type": "object", "properties": {"x": {"type": "number"}}},
            {"x": float("nan")},
            "must be a finite number",
        ),
        (
            {"type": "object", "properties": {"l": {"type": "array", "maxItems": 1}}},
            {"l": [1, 2]},
            "at most 1 items",
        ),
    ],
)
def test_schema_checker(schema: dict[str, Any], arguments: dict[str, Any], fragment: str | None) -> None:
    error = check_arguments(schema, arguments)
    assert error is None if fragment is None else fragment in (error or "")


@pytest.mark.parametrize("name", sorted(TOOLSETS))
def test_specs_are_closed_json_schemas(name: str) -> None:
    toolset = get_toolset(name)
    assert len(toolset.tools()) >= (2 if name == "calculator" else 4)  # calculator: kept short
    for spec in toolset.tools():
        assert spec.parameters["type"] == "object" and spec.parameters["additionalProperties"] is False
        assert hasattr(toolset, f"tool_{spec.name}") and spec.description
        assert json.loads(json.dumps(spec.to_openai()))["function"]["name"] == spec.name


def _run_calls(state: ToolsetState, calls: int = 12) -> list[str]:
    toolset = get_toolset("bank")
    args = {"from_account": "checking", "to_account": "savings", "amount": 1}
    return [toolset.call(state, "transfer", args) for _ in range(calls)]


def test_transient_failures_are_seeded_and_resume_after_a_round_trip() -> None:
    first, second = bank_state(), bank_state()
    first.failure_rate = second.failure_rate = 0.5
    results = _run_calls(first)
    assert results == _run_calls(second) and first.model_dump() == second.model_dump()
    assert any("temporary failure" in r for r in results) and any(not is_error(r) for r in results)
    assert first.accounts["checking"] == 10_000 - 100 * sum(not is_error(r) for r in results)
    restored = load_state(json.loads(first.model_dump_json()))
    assert _run_calls(restored, 5) == _run_calls(first, 5)
    other = bank_state().model_copy(update={"seed": 1, "failure_rate": 0.5})
    assert _run_calls(other) != results


def test_zero_failure_rate_draws_nothing_and_full_rate_always_fails() -> None:
    quiet, broken = bank_state(), bank_state().model_copy(update={"failure_rate": 1.0})
    assert not any(is_error(r) for r in _run_calls(quiet, 3)) and quiet.rng_draws == 0
    assert all("temporary failure" in r for r in _run_calls(broken, 3))
    assert broken.accounts == bank_state().accounts


MUTATIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "filesystem": ("delete_file", {"path": "a.txt"}),
    "calendar": ("delete_event", {"event_id": "evt-1"}),
    "bank": ("transfer", {"from_account": "checking", "to_account": "savings", "amount": 5}),
}


@pytest.mark.parametrize("name", sorted(STATES))
def test_state_json_round_trip_and_deep_copy(name: str) -> None:
    state = STATES[name]()
    restored = load_state(json.loads(state.model_dump_json()))
    assert type(restored) is type(state) and restored == state
    copy = load_state(state)
    tool, arguments = MUTATIONS[name]
    assert not is_error(get_toolset(name).call(copy, tool, arguments))
    assert copy != state and state == STATES[name]()


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_template_is_deterministic_and_its_reference_passes(template: str) -> None:
    make = TEMPLATES[template]
    assert make(random.Random(7)) == make(random.Random(7))
    assert len({make(random.Random(seed)).model_dump_json() for seed in range(20)}) >= 15
    for seed in range(25):
        scenario = make(random.Random(seed))
        toolset, state = get_toolset(scenario.toolset), load_state(scenario.initial_state)
        assert not all(check_state(c, state.model_dump(mode="json")) for c in scenario.success)
        records = []
        for turn, calls in enumerate(scenario.reference_turns):
            for call in calls:
                result = toolset.call(state, call.name, call.arguments)
                assert not is_error(result), (seed, call, result)
                arguments = toolset.canonical_arguments(call.name, call.arguments)
                records.append(ToolCallRecord(turn=turn, id="x", name=call.name, arguments=arguments, ok=True))
        final = state.model_dump(mode="json")
        assert all(check_state(check, final) for check in scenario.success), seed
        assert all(check_checkpoint(cp, records, final) for cp in scenario.checkpoints), seed
        assert answer_matches(scenario.answer, scenario.reference_answer)


@pytest.mark.parametrize(
    ("pattern", "actual", "expected"),
    [
        ({"a": "Bob"}, {"a": " bob ", "b": 1}, True),
        ({"amount": 25}, {"amount": 25.0}, True),
        ({"amount": 25}, {"amount": 25.01}, False),
        ({"xs": ["b"]}, {"xs": ["a", "b"]}, True),
        ({"xs": ["c"]}, {"xs": ["a", "b"]}, False),
        ({"flag": 1}, {"flag": True}, False),
        ({"k": 1}, {}, False),
    ],
)
def test_values_match(pattern: Any, actual: Any, expected: bool) -> None:
    assert values_match(pattern, actual) is expected


@pytest.mark.parametrize(
    ("groups", "text", "expected"),
    [
        ([["125.00", "$125"]], "Your balance is $125.", True),
        ([["125.00", "$125"]], "Your balance is $1,125.00", False),
        ([["1125.00"]], "Your balance is $1,125.00", True),
        ([["2"], ["Standup"]], "You have 2 meetings; STANDUP is first.", True),
        ([["2", "two"]], "You have 12 meetings", False),
        ([["14:00", "2 pm"]], "It starts at 2 PM.", True),
        ([], "anything", True),
    ],
)
def test_answer_matching(groups: list[list[str]], text: str, expected: bool) -> None:
    assert answer_matches(groups, text) is expected


def test_answer_alternative_helpers() -> None:
    assert money_alternatives(12_500) == ["125.00", "$125"] and money_alternatives(12_550) == ["125.50"]
    assert "2 pm" in time_alternatives(14 * 60) and time_alternatives(9 * 60 + 30) == [
        "09:30",
        "9:30",
    ]


def _record(position: int, tool: str, ok: bool = True, **arguments: Any) -> ToolCallRecord:
    return ToolCallRecord(turn=position, id=f"functions.{tool}:{position}", name=tool, arguments=arguments, ok=ok)


@pytest.mark.parametrize(
    ("calls", "expected"),
    [
        ([_record(0, "read_file", path="a"), _record(1, "write_file", path="a")], True),
        ([_record(0, "write_file", path="a"), _record(1, "read_file", path="a")], False),
        ([_record(0, "read_file", ok=False, path="a"), _record(1, "write_file", path="a")], False),
        ([_record(0, "read_file", path="a")], True),
        ([], False),
    ],
)
def test_ordered_checkpoint(calls: list[ToolCallRecord], expected: bool) -> None:
    checkpoint = Checkpoint(
        id="read_first",
        calls=[CallPattern(tool="read_file", args={"path": "a"})],
        before=CallPattern(tool="write_file", args={"path": "a"}),
    )
    assert check_checkpoint(checkpoint, calls, {}) is expected


@pytest.mark.parametrize(
    ("check", "expected"),
    [
        (StateCheck(path=["files", "a.txt"], op="text_equals", value="hello\nworld"), True),
        (StateCheck(path=["files", "a.txt"], op="absent"), False),
        (StateCheck(path=["files", "x"], op="not_contains", value="y"), True),
        (StateCheck(path=["dirs"], op="contains", value="docs"), True),
        (StateCheck(path=["dirs", 0], op="equals", value="docs"), True),
        (StateCheck(path=["files"], op="length", value=2), True),
    ],
)
def test_state_checks(check: StateCheck, expected: bool) -> None:
    assert check_state(check, fs_state().model_dump(mode="json")) is expected


@pytest.mark.parametrize(
    "groups, text, context, stray",
    [
        ([["42"]], "The answer is 42.", "Multiply 6 by 7.", []),
        ([["42"]], "The answer is 41 42 43.", "Multiply 6 by 7.", ["41", "43"]),  # a hedge around the value
        ([["42"]], "6 x 7 = 42.", "Multiply 6 by 7.", []),  # operands come from the prompt
        ([["351.08"]], "Moved $351.08; travel now holds $100.00.", "Leave $100 in travel.", []),  # by value
        ([["1355.16"]], "Your savings balance is now $1,355.16.", "", []),  # thousands separator
        ([["Frank"]], "Invited: Frank, Bob.", "", []),  # answers without a number are not checked
    ],
)
def test_stray_numbers_are_candidate_values_the_episode_never_showed(groups, text, context, stray):
    assert stray_numbers(groups, text, context) == stray
