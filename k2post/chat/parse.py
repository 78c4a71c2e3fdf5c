"""Parse a generated K2 assistant turn into reasoning, content and tool calls; never raises.

Input is what the model wrote after the generation prompt `<|im_assistant|>assistant<|im_middle|>`,
with or without the closing `<|im_end|>` (anything after `<|im_end|>`, `<|endoftext|>` or the start of a new
message is ignored). In the thinking format the prompt ends with `<think>`, so the turn starts inside the
reasoning (`reasoning</think>answer`): pass `thinking=True`. Malformed tool calls become `ToolCallParseError`
records whose `.message` can be handed back to the model; a call is listed in `tool_calls` only when it has
no error. Arguments are read with `json.loads` (never eval).

It survives what deployed K2 parsers tripped on (tests/k2post/chat/test_parse.py, "deployed failures"):
a `<think>` never closed before the tool-call section (reasoning ends at the section; soft error
`unterminated_think`), the singular `<|tool_call_section_begin|>` / `<|tool_call_section_end|>` spelling (read
as the plural), several calls in one section, raw tool-call tags leaking into the content (removed from it;
soft error `leaked_tags`), and call indices that do not count up (kept as written; the template renumbers
them when the dialogue is rendered, `strict_ids=True` reports them; an index counted per turn is accepted as well as
one counted per dialogue). Soft errors (`SOFT_ERRORS`) describe the
text but leave nothing to tell the model.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Literal

from k2post.chat.tokens import (
    EOS,
    IM_END,
    MESSAGE_STARTS,
    THINK_BEGIN,
    THINK_END,
    TOOL_CALL_ARG_BEGIN,
    TOOL_CALL_BEGIN,
    TOOL_CALL_END,
    TOOL_CALLS_BEGIN,
    TOOL_CALLS_END,
)
from k2post.chat.types import Message, ToolCall, call_name, split_call_id

ErrorKind = Literal[
    "bad_json",
    "args_not_object",
    "bad_id",
    "bad_index",
    "unknown_tool",
    "missing_arguments",
    "unterminated_call",
    "unterminated_section",
    "missing_section_begin",
    "unexpected_text",
    "unterminated_think",
    "leaked_tags",
]
SOFT_ERRORS = frozenset({"unterminated_think", "leaked_tags"})  # recorded, nothing for the model to fix
SECTION_ALIASES = {  # spellings deployed models produce, read as the template's own
    "<|tool_call_section_begin|>": TOOL_CALLS_BEGIN,
    "<|tool_call_section_end|>": TOOL_CALLS_END,
}
TOOL_TAGS = (TOOL_CALLS_BEGIN, TOOL_CALLS_END, TOOL_CALL_BEGIN, TOOL_CALL_END, TOOL_CALL_ARG_BEGIN)

TURN_STOPS = (IM_END, EOS, *MESSAGE_STARTS)
RAW_PREVIEW_CHARS = 200


@dataclass(frozen=True)
class ToolCallParseError:
    """One problem found in a generated turn. `call_index` is the call's position in the turn
    (None for turn-level problems); `message` is model-readable, e.g.
    "tool call 0: arguments are not valid JSON: Expecting ',' delimiter: ..."."""

    kind: ErrorKind
    call_index: int | None
    raw: str
    message: str
    call_id: str | None = None

    def to_tool_message(self) -> Message | None:
        """A tool-result message reporting this error for its call, or None without a call id."""
        if self.call_id is None:
            return None
        return Message(
            role="tool", tool_call_id=self.call_id, content=f"Error: {self.message}", name=call_name(self.call_id)
        )


@dataclass(frozen=True)
class ParsedAssistant:
    """A parsed assistant turn: `tool_calls` holds only the well-formed calls."""

    content: str
    reasoning: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[ToolCallParseError] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the turn parsed without any error."""
        return not self.errors

    def to_message(self) -> Message:
        """The turn as an assistant `Message` (well-formed calls only)."""
        return Message(
            role="assistant",
            content=self.content,
            reasoning=self.reasoning,
            tool_calls=self.tool_calls,
        )


def _error(
    kind: ErrorKind, call_index: int | None, raw: str, detail: str, call_id: str | None = None
) -> ToolCallParseError:
    """Build an error whose message starts with where it happened."""
    where = "assistant turn" if call_index is None else f"tool call {call_index}"
    return ToolCallParseError(kind=kind, call_index=call_index, raw=raw, message=f"{where}: {detail}", call_id=call_id)


def _preview(raw: str) -> str:
    """Short repr of raw text for error messages."""
    return repr(raw if len(raw) <= RAW_PREVIEW_CHARS else raw[:RAW_PREVIEW_CHARS] + "...")


def _cut_turn(text: str) -> str:
    """The turn up to its first stop marker."""
    stops = [position for position in (text.find(stop) for stop in TURN_STOPS) if position != -1]
    return text[: min(stops)] if stops else text


def _first_call_marker(text: str, start: int = 0) -> int:
    """Where the first tool-call section (or bare call) begins in `text`, or -1."""
    found = [p for p in (text.find(TOOL_CALLS_BEGIN, start), text.find(TOOL_CALL_BEGIN, start)) if p != -1]
    return min(found) if found else -1


def _split_reasoning(body: str) -> tuple[str | None, str, list[ToolCallParseError]]:
    """`(reasoning, rest, errors)`; a bare `</think>` (prefilled `<think>`) also ends reasoning, and so does a
    tool-call section that starts before any `</think>` (soft `unterminated_think`: the calls still count)."""
    if body.startswith(THINK_BEGIN):
        end = body.find(THINK_END, len(THINK_BEGIN))
        marker = _first_call_marker(body, len(THINK_BEGIN))
        if end == -1 or (marker != -1 and marker < end):
            detail = f"reasoning not closed with {THINK_END}"
            if marker == -1:
                return body[len(THINK_BEGIN) :], "", [_error("unterminated_think", None, body, detail)]
            error = _error("unterminated_think", None, body[:marker], detail + " before the tool calls")
            return body[len(THINK_BEGIN) : marker], body[marker:], [error]
        return body[len(THINK_BEGIN) : end], body[end + len(THINK_END) :], []
    end = body.find(THINK_END)
    section = body.find(TOOL_CALLS_BEGIN)
    if end != -1 and (section == -1 or end < section):
        return body[:end], body[end + len(THINK_END) :], []
    return None, body, []


def _split_section(rest: str) -> tuple[str, str, list[ToolCallParseError]]:
    """`(content, tool-call section inner text, errors)`."""
    errors: list[ToolCallParseError] = []
    start = rest.find(TOOL_CALLS_BEGIN)
    inner_start = start + len(TOOL_CALLS_BEGIN)
    if start == -1:
        start = inner_start = rest.find(TOOL_CALL_BEGIN)
        if start == -1:
            return rest, "", []
        errors.append(
            _error(
                "missing_section_begin",
                None,
                rest[start:],
                f"tool calls must start with {TOOL_CALLS_BEGIN}",
            )
        )
    end = rest.find(TOOL_CALLS_END, inner_start)
    if end == -1:
        errors.append(
            _error(
                "unterminated_section",
                None,
                rest[start:],
                f"section not closed with {TOOL_CALLS_END}",
            )
        )
        return rest[:start], rest[inner_start:], errors
    trailing = rest[end + len(TOOL_CALLS_END) :]
    if trailing.strip():
        errors.append(
            _error(
                "unexpected_text",
                None,
                trailing,
                f"text after {TOOL_CALLS_END}: {_preview(trailing)}",
            )
        )
    return rest[:start], rest[inner_start:end], errors


@dataclass(frozen=True)
class _CallRules:
    """What a call is checked against."""

    start_index: int
    known_tools: Collection[str] | None
    strict_ids: bool


def _parse_arguments(raw_args: str, ordinal: int, call_id: str) -> dict[str, Any] | ToolCallParseError:
    """The arguments object, or the error explaining why there is none."""
    try:
        arguments = json.loads(raw_args)
    except (ValueError, RecursionError) as exc:
        return _error("bad_json", ordinal, raw_args, f"arguments are not valid JSON: {exc}", call_id)
    if not isinstance(arguments, dict):
        detail = f"arguments must be a JSON object, got {type(arguments).__name__}"
        return _error("args_not_object", ordinal, raw_args, detail, call_id)
    return arguments


def _parse_call(chunk: str, ordinal: int, rules: _CallRules) -> ToolCall | ToolCallParseError:
    """One call from the text between `<|tool_call_begin|>` and `<|tool_call_end|>`."""
    split_at = chunk.find(TOOL_CALL_ARG_BEGIN)
    if split_at == -1:
        return _error("missing_arguments", ordinal, chunk, f"no {TOOL_CALL_ARG_BEGIN} after the call id")
    call_id = chunk[:split_at].strip()
    name_and_index = split_call_id(call_id)
    if name_and_index is None:
        return _error(
            "bad_id",
            ordinal,
            chunk,
            f"call id {_preview(call_id)} does not read functions.NAME:IDX",
        )
    name, index = name_and_index
    expected = rules.start_index + ordinal
    if rules.strict_ids and index not in (expected, ordinal):
        return _error(
            "bad_index",
            ordinal,
            chunk,
            f"call id {call_id!r} should have index {expected} (or {ordinal}, counted in this turn)",
            call_id,
        )
    if rules.known_tools is not None and name not in rules.known_tools:
        return _error("unknown_tool", ordinal, chunk, f"unknown tool {name!r}", call_id)
    arguments = _parse_arguments(chunk[split_at + len(TOOL_CALL_ARG_BEGIN) :], ordinal, call_id)
    if isinstance(arguments, ToolCallParseError):
        return arguments
    return ToolCall(id=call_id, name=name, arguments=arguments)


def _readable_call_id(chunk: str) -> str | None:
    """The call id at the start of a call's text when it is a valid K2 id, else None."""
    call_id = chunk.split(TOOL_CALL_ARG_BEGIN, 1)[0].strip()
    return call_id if split_call_id(call_id) is not None else None


def _call_chunks(section: str) -> tuple[list[tuple[str, bool]], list[ToolCallParseError]]:
    """`(call text, terminated)` per `<|tool_call_begin|>`, plus errors for text between calls."""
    chunks: list[tuple[str, bool]] = []
    errors: list[ToolCallParseError] = []
    position = 0
    next_end = -2  # cached position of the next TOOL_CALL_END (-1: none left; -2: not searched)
    while position <= len(section):
        begin = section.find(TOOL_CALL_BEGIN, position)
        gap = section[position:] if begin == -1 else section[position:begin]
        if gap.strip():
            errors.append(_error("unexpected_text", None, gap, f"text outside a call: {_preview(gap)}"))
        if begin == -1:
            break
        inner = begin + len(TOOL_CALL_BEGIN)
        if next_end == -2 or (next_end != -1 and next_end < inner):  # search again only when passed
            next_end = section.find(TOOL_CALL_END, inner)
        end, next_begin = next_end, section.find(TOOL_CALL_BEGIN, inner)
        if end == -1 or (next_begin != -1 and next_begin < end):
            stop = len(section) if next_begin == -1 else next_begin
            chunks.append((section[inner:stop], False))
            position = stop
        else:
            chunks.append((section[inner:end], True))
            position = end + len(TOOL_CALL_END)
    return chunks, errors


def _parse_section(section: str, rules: _CallRules) -> tuple[list[ToolCall], list[ToolCallParseError]]:
    """Well-formed calls and errors of a tool-call section's inner text."""
    chunks, errors = _call_chunks(section)
    calls: list[ToolCall] = []
    for ordinal, (chunk, terminated) in enumerate(chunks):
        if not terminated:
            detail = f"call not closed with {TOOL_CALL_END}"
            errors.append(_error("unterminated_call", ordinal, chunk, detail, _readable_call_id(chunk)))
            continue
        parsed = _parse_call(chunk, ordinal, rules)
        if isinstance(parsed, ToolCallParseError):
            errors.append(parsed)
        else:
            calls.append(parsed)
    return calls, errors


def parse_assistant(
    text: str,
    start_index: int = 0,
    known_tools: Collection[str] | None = None,
    strict_ids: bool = False,
    thinking: bool = False,
) -> ParsedAssistant:
    """Parse generated assistant text. `start_index` is the dialogue-wide index the turn's first
    call should carry (checked only with `strict_ids`, which also accepts the index counted within the turn);
    `known_tools` flags calls to other tools; `thinking`: the text follows the thinking format's prompt `<think>`
    (reasoning first, then `</think>`; a text that repeats the `<think>` is read the same)."""
    for alias, canonical in SECTION_ALIASES.items():
        text = text.replace(alias, canonical)
    if thinking and not text.startswith(THINK_BEGIN):
        text = THINK_BEGIN + text
    reasoning, rest, errors = _split_reasoning(_cut_turn(text))
    content, section, section_errors = _split_section(rest)
    content, leaked = _strip_tags(content)
    rules = _CallRules(start_index=start_index, known_tools=known_tools, strict_ids=strict_ids)
    calls, call_errors = _parse_section(section, rules)
    return ParsedAssistant(
        content=content,
        reasoning=reasoning,
        tool_calls=calls,
        errors=errors + section_errors + leaked + call_errors,
    )


def _strip_tags(content: str) -> tuple[str, list[ToolCallParseError]]:
    """Content without stray tool-call tags (a soft `leaked_tags` error records what was removed)."""
    if not any(tag in content for tag in TOOL_TAGS):
        return content, []
    cleaned = content
    for tag in TOOL_TAGS:
        cleaned = cleaned.replace(tag, "")
    return cleaned, [_error("leaked_tags", None, content, "raw tool-call tags in the content were removed")]
