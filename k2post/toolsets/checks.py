"""Scenarios (a task for a toolset) and the JSON-able checks that grade an episode.

A `Scenario` is what a template makes: a prompt, the initial toolset state, success checks on
the final state, checkpoints along the way, the expected final-answer substrings, and a
reference solution (tool calls per turn plus a final answer) that passes every check.

- `StateCheck`: a predicate on the final state's `model_dump()` at a key `path`
  (`equals`, `text_equals`, `absent`, `present`, `contains`, `not_contains`, `length`).
- `CallPattern`: a successful call of `tool` whose canonical arguments match `args`
  (subset match; strings compare case-insensitively, numbers by value).
- `Checkpoint`: passes when one of `calls` happened (optionally before / after another
  pattern's first match) and all of its `state` checks hold.
- `answer`: groups of alternatives; every group needs one alternative in the final answer
  (case-insensitive, not glued to a letter or digit on either side).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

RESERVED_KEYS = ("final_state", "answer")
_MISSING = object()

StateOp = Literal["equals", "text_equals", "absent", "present", "contains", "not_contains", "length"]


class StateCheck(BaseModel):
    """A predicate on the final state at `path` (keys / list indices into `model_dump()`)."""

    model_config = ConfigDict(extra="forbid")

    path: list[str | int] = Field(description="Keys and indices from the state's root.")
    op: StateOp = Field(description="The comparison.")
    value: Any = Field(None, description="Operand of equals / contains / length.")
    description: str = Field("", description="What it checks, for humans.")


class CallPattern(BaseModel):
    """A successful call of `tool` whose arguments include `args` (subset match)."""

    model_config = ConfigDict(extra="forbid")

    tool: str = Field(description="Tool name.")
    args: dict[str, Any] = Field(default_factory=dict, description="Required argument values.")


class Checkpoint(BaseModel):
    """An intermediate goal: a call that happened (in order) and/or facts on the final state."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, description="Key in the reward breakdown.")
    description: str = Field("", description="What it checks, for humans.")
    calls: list[CallPattern] = Field(default_factory=list, description="Any one of these happened.")
    before: CallPattern | None = Field(None, description="...before the first match of this.")
    after: CallPattern | None = Field(None, description="...after the first match of this.")
    state: list[StateCheck] = Field(default_factory=list, description="All hold at the end.")


class ToolCallRecord(BaseModel):
    """One executed (or rejected) tool call of an episode."""

    turn: int = Field(description="Assistant turn (0-based) that made the call.")
    id: str = Field(description="Call id.")
    name: str = Field(description="Tool name as called.")
    arguments: dict[str, Any] = Field(default_factory=dict, description="Canonical arguments.")
    result: str = Field("", description="What the tool returned.")
    ok: bool = Field(False, description="The call succeeded (result is not an error).")


class ReferenceCall(BaseModel):
    """One call of a reference solution."""

    name: str = Field(description="Tool name.")
    arguments: dict[str, Any] = Field(default_factory=dict, description="Arguments object.")


class Scenario(BaseModel):
    """A task for one toolset: prompt, initial state, checks and a reference solution."""

    model_config = ConfigDict(extra="forbid")

    toolset: str = Field(description="Name of the toolset.")
    template: str = Field(description="Name of the template that made it.")
    prompt: str = Field(description="The user's request.")
    initial_state: dict[str, Any] = Field(description="The toolset state's model_dump().")
    success: list[StateCheck] = Field(description="All must hold on the final state.")
    checkpoints: list[Checkpoint] = Field(default_factory=list, description="Partial credit.")
    answer: list[list[str]] = Field(default_factory=list, description="Alternatives per group.")
    reference_turns: list[list[ReferenceCall]] = Field(
        default_factory=list, description="A correct solution: tool calls per assistant turn."
    )
    reference_answer: str = Field("", description="The reference final answer.")
    wrong_answers: list[str] = Field(
        default_factory=list,
        description="Texts the final answer must not contain: the other candidates of a question (an answer that "
        "names every candidate answers nothing).",
    )

    @model_validator(mode="after")
    def _check_ids(self) -> Scenario:
        ids = [checkpoint.id for checkpoint in self.checkpoints]
        if len(set(ids)) != len(ids) or set(ids) & set(RESERVED_KEYS):
            raise ValueError(f"checkpoint ids must be unique and not {RESERVED_KEYS}: {ids}")
        return self


def _lookup(data: Any, path: list[str | int]) -> Any:
    """The value at `path`, or `_MISSING`."""
    for key in path:
        in_dict = isinstance(data, dict) and key in data
        in_list = isinstance(data, list) and isinstance(key, int) and -len(data) <= key < len(data)
        if in_dict or in_list:
            data = data[key]
        else:
            return _MISSING
    return data


def values_match(pattern: Any, actual: Any) -> bool:
    """Subset match: dict keys and list items of `pattern` found in `actual`, loose scalars."""
    if isinstance(pattern, dict):
        return isinstance(actual, dict) and all(
            key in actual and values_match(value, actual[key]) for key, value in pattern.items()
        )
    if isinstance(pattern, list):
        return isinstance(actual, list) and all(
            any(values_match(item, candidate) for candidate in actual) for item in pattern
        )
    if isinstance(pattern, str):
        return isinstance(actual, str) and pattern.strip().casefold() == actual.strip().casefold()
    if isinstance(pattern, (int, float)) and not isinstance(pattern, bool):
        numeric = isinstance(actual, (int, float)) and not isinstance(actual, bool)
        return numeric and abs(pattern - actual) < 1e-9
    return pattern == actual


def normalize_text(text: str) -> str:
    """Text with trailing spaces of each line and trailing newlines removed."""
    return "\n".join(line.rstrip() for line in text.strip("\n").split("\n")).rstrip()


def _contains(container: Any, value: Any) -> bool:
    if isinstance(container, str):
        return isinstance(value, str) and value in container
    if isinstance(container, dict):
        return value in container
    if isinstance(container, list):
        return any(values_match(value, item) for item in container)
    return False


def check_state(check: StateCheck, state: dict[str, Any]) -> bool:
    """Whether `check` holds on a state dump."""
    found = _lookup(state, check.path)
    if check.op == "absent":
        return found is _MISSING
    if found is _MISSING:
        return check.op == "not_contains"
    if check.op == "present":
        return True
    if check.op == "equals":
        return found == check.value
    if check.op == "text_equals":
        return isinstance(found, str) and normalize_text(found) == normalize_text(check.value)
    if check.op == "length":
        return hasattr(found, "__len__") and len(found) == check.value
    contained = _contains(found, check.value)
    return contained if check.op == "contains" else not contained


def _first_match(pattern: CallPattern, calls: list[ToolCallRecord]) -> int | None:
    """Position of the first successful call matching `pattern`."""
    for position, call in enumerate(calls):
        if call.ok and call.name == pattern.tool and values_match(pattern.args, call.arguments):
            return position
    return None


def _call_positions(checkpoint: Checkpoint, calls: list[ToolCallRecord]) -> list[int]:
    """Positions of the successful calls matching any of the checkpoint's patterns."""
    return [
        position
        for position, call in enumerate(calls)
        if call.ok
        and any(
            call.name == pattern.tool and values_match(pattern.args, call.arguments) for pattern in checkpoint.calls
        )
    ]


def check_checkpoint(checkpoint: Checkpoint, calls: list[ToolCallRecord], state: dict[str, Any]) -> bool:
    """Whether a checkpoint passed, given the episode's call log and final state dump."""
    if not all(check_state(check, state) for check in checkpoint.state):
        return False
    if not checkpoint.calls:
        return True
    positions = _call_positions(checkpoint, calls)
    if checkpoint.before is not None:
        limit = _first_match(checkpoint.before, calls)
        positions = [p for p in positions if limit is None or p < limit]
    if checkpoint.after is not None:
        start = _first_match(checkpoint.after, calls)
        positions = [p for p in positions if start is not None and p > start]
    return bool(positions)


def normalize_answer(text: str) -> str:
    """Lower-cased text with thousands separators (`1,234`) removed."""
    return re.sub(r"(?<=\d),(?=\d{3})", "", text).casefold()


def _found(needle: str, haystack: str) -> bool:
    """Whether normalized `needle` occurs in normalized `haystack`, not glued to a word."""
    return re.search(rf"(?<![0-9a-z]){re.escape(needle)}(?![0-9a-z])", haystack) is not None


def alternative_found(alternative: str, text: str) -> bool:
    """Whether `alternative` occurs in `text` (case-insensitive, not glued to a letter/digit)."""
    return _found(normalize_answer(alternative).strip(), normalize_answer(text))


def answer_matches(groups: list[list[str]], text: str) -> bool:
    """Whether every group has an alternative in `text`."""
    haystack = normalize_answer(text)
    return all(any(_found(normalize_answer(alt).strip(), haystack) for alt in group) for group in groups)


NUMBER = re.compile(r"\d+(?:\.\d+)?")
THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def numbers(text: str) -> set[str]:
    """The numbers written in `text`, by value ("$1,355.16" -> "1355.16", "100.00" -> "100", "03" -> "3")."""
    return {_by_value(found) for found in NUMBER.findall(THOUSANDS.sub("", text))}


def _by_value(number: str) -> str:
    """A written number in one spelling per value, without converting it (a reply may hold a million digits)."""
    whole, _, fraction = number.partition(".")
    whole, fraction = whole.lstrip("0") or "0", fraction.rstrip("0")
    return f"{whole}.{fraction}" if fraction else whole


def stray_numbers(groups: list[list[str]], text: str, context: str) -> list[str]:
    """Numbers of a final answer that no expected alternative and nothing the episode showed (`context`: the
    prompt and the tool results) holds: a second candidate value, as in the hedge "41 42 43" around 42. Only
    answers expected to state a number are checked ([] otherwise); numbers compare by value, so "$1,355.16" and
    "1355.16" agree, as do "100.00" and "100"."""
    expected = {number for group in groups for alternative in group for number in numbers(alternative)}
    if not expected:
        return []
    known = expected | numbers(context)
    return sorted(numbers(text) - known)


def answer_ok(scenario: Scenario, text: str, context: str | None = None) -> bool:
    """The final answer has every expected group, none of the scenario's wrong answers and, given the episode's
    `context` (prompt and tool results), no stray number beside the expected one (`stray_numbers`: a hedge)."""
    wrong = any(alternative_found(alternative, text) for alternative in scenario.wrong_answers)
    hedged = context is not None and bool(stray_numbers(scenario.answer, text, context))
    return answer_matches(scenario.answer, text) and not wrong and not hedged


_NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def count_alternatives(count: int) -> list[str]:
    """Ways to write a small count in a final answer: digits and (up to nine) the word."""
    words = [_NUMBER_WORDS[count]] if 0 <= count < len(_NUMBER_WORDS) else []
    return [str(count), *words]


def expect(path: list[str | int], op: StateOp, value: Any = None, description: str = "") -> StateCheck:
    """Shorthand for a StateCheck."""
    return StateCheck(path=path, op=op, value=value, description=description)


def called(tool: str, **args: Any) -> CallPattern:
    """Shorthand for a CallPattern."""
    return CallPattern(tool=tool, args=args)


def ref_call(tool: str, **arguments: Any) -> ReferenceCall:
    """Shorthand for a ReferenceCall."""
    return ReferenceCall(name=tool, arguments=arguments)


DEV_FRACTION = 0.1
"""Default share of the task space (by content hash, right above the test share) that is dev."""


def scenario_key(scenario: Scenario) -> str:
    """A scenario's content (template, prompt, initial state) as canonical JSON: what splits and
    de-duplication compare."""
    from k2post.chat.types import dump_json

    return dump_json([scenario.template, scenario.prompt, scenario.initial_state])


def scenario_split(
    scenario: Scenario, test_fraction: float, dev_fraction: float = DEV_FRACTION
) -> Literal["train", "dev", "test"]:
    """Which split a scenario belongs to: a hash of its template, prompt and initial state (test
    below test_fraction, dev in the next dev_fraction, train above). Shared by the tool_use gym
    and SFT data synthesis, so synthesized training data never contains the gym's dev or test
    tasks."""
    from k2post.envs.splits import hash_split

    return hash_split(scenario_key(scenario), test_fraction, dev_fraction)
