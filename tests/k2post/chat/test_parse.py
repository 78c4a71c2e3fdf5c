"""Parsing generated K2 assistant turns: round trips, error records, never raising."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k2post.chat.parse import parse_assistant
from k2post.chat.template import render_assistant_body
from k2post.chat.tokens import IM_END, SPECIAL_TOKENS
from k2post.chat.types import Message, ToolCall

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"


def _call_text(call_id: str, arguments: str) -> str:
    return f"<|tool_call_begin|>{call_id}<|tool_call_argument_begin|>{arguments}<|tool_call_end|>"


def _section(*calls: str) -> str:
    return SECTION_BEGIN + "".join(calls) + SECTION_END


@pytest.mark.parametrize(
    ("text", "content", "reasoning", "call_names"),
    [
        ("Hello", "Hello", None, []),
        ("Hello<|im_end|>ignored", "Hello", None, []),
        ("<think>hm</think>Hi<|im_end|>", "Hi", "hm", []),
        ("hm</think>Hi", "Hi", "hm", []),
        ("Hi<|endoftext|>more", "Hi", None, []),
        ("Hi<|im_user|>user<|im_middle|>x", "Hi", None, []),
        ("Hi<|im_system|>tool<|im_middle|>x", "Hi", None, []),
        ("Hi<|im_assistant|>assistant<|im_middle|>x", "Hi", None, []),
        ("x" + _section(_call_text("functions.f:0", '{"a": 1}')) + IM_END, "x", None, ["f"]),
        (_section(_call_text(" functions.f:0 ", ' {"a": 1} ')), "", None, ["f"]),
        (
            _section(_call_text("functions.ns.tool-x:0", "{}"), _call_text("functions.g:1", "{}")),
            "",
            None,
            ["ns.tool-x", "g"],
        ),
        (_section(), "", None, []),
    ],
    ids=[
        "plain",
        "stops_at_im_end",
        "think",
        "prefilled_think",
        "stops_at_eos",
        "stops_at_user_message",
        "stops_at_system_message",
        "stops_at_assistant_message",
        "one_call",
        "spaces_around",
        "two_calls",
        "empty_section",
    ],
)
def test_well_formed_turns(text: str, content: str, reasoning: str | None, call_names: list[str]) -> None:
    parsed = parse_assistant(text)
    assert parsed.ok, parsed.errors
    assert (parsed.content, parsed.reasoning) == (content, reasoning)
    assert [call.name for call in parsed.tool_calls] == call_names


@pytest.mark.parametrize(
    ("text", "kinds", "call_names", "message_start"),
    [
        (
            _section(_call_text("functions.f:0", '{"a": 1,}')),
            ["bad_json"],
            [],
            "tool call 0: arguments are not valid JSON: Expecting",
        ),
        (
            _section(_call_text("functions.f:0", "")),
            ["bad_json"],
            [],
            "tool call 0: arguments are not valid JSON",
        ),
        (
            _section(_call_text("functions.f:0", "[1, 2]")),
            ["args_not_object"],
            [],
            "tool call 0: arguments must be a JSON object, got list",
        ),
        (
            _section(_call_text("f", "{}")),
            ["bad_id"],
            [],
            "tool call 0: call id 'f' does not read functions.NAME:IDX",
        ),
        (_section(_call_text("functions.f:x", "{}")), ["bad_id"], [], "tool call 0: call id"),
        (
            _section("<|tool_call_begin|>functions.f:0{}<|tool_call_end|>"),
            ["missing_arguments"],
            [],
            "tool call 0: no",
        ),
        (
            SECTION_BEGIN + _call_text("functions.f:0", "{}"),
            ["unterminated_section"],
            ["f"],
            "assistant turn: section not closed",
        ),
        (
            _section(
                "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}",
                _call_text("functions.g:1", "{}"),
            ),
            ["unterminated_call"],
            ["g"],
            "tool call 0: call not closed",
        ),
        (
            "hi" + _call_text("functions.f:0", "{}"),
            ["missing_section_begin", "unterminated_section"],
            ["f"],
            "assistant turn: tool calls must start",
        ),
        (
            _section(_call_text("functions.f:0", "{}")) + "late",
            ["unexpected_text"],
            ["f"],
            "assistant turn: text after",
        ),
        (
            _section("junk", _call_text("functions.f:0", "{}")),
            ["unexpected_text"],
            ["f"],
            "assistant turn: text outside a call",
        ),
        ("<think>never closed", ["unterminated_think"], [], "assistant turn: reasoning not closed"),
        (
            _section(
                _call_text("functions.f:0", "{bad"),
                _call_text("functions.g:1", "{}"),
                _call_text("functions.h:2", "1"),
            ),
            ["bad_json", "args_not_object"],
            ["g"],
            "tool call 0:",
        ),
    ],
    ids=[
        "trailing_comma",
        "empty_args",
        "list_args",
        "bad_id",
        "non_int_index",
        "no_arg_token",
        "no_section_end",
        "unterminated_call",
        "no_section_begin",
        "text_after_section",
        "text_between_calls",
        "open_think",
        "mixed",
    ],
)
def test_malformed_turns(text: str, kinds: list[str], call_names: list[str], message_start: str) -> None:
    parsed = parse_assistant(text)
    assert [error.kind for error in parsed.errors] == kinds
    assert [call.name for call in parsed.tool_calls] == call_names
    assert parsed.errors[0].message.startswith(message_start)


def test_error_becomes_tool_message() -> None:
    parsed = parse_assistant(_section(_call_text("functions.f:3", "{oops")))
    (error,) = parsed.errors
    assert (error.call_index, error.call_id, error.raw) == (0, "functions.f:3", "{oops")
    message = error.to_tool_message()
    assert message == Message(role="tool", tool_call_id="functions.f:3", content="Error: " + error.message, name="f")
    assert parse_assistant(_section(_call_text("nope", "{}"))).errors[0].to_tool_message() is None


def test_known_tools() -> None:
    text = _section(_call_text("functions.f:0", "{}"), _call_text("functions.rm_rf:1", "{}"))
    parsed = parse_assistant(text, known_tools={"f"})
    assert [call.name for call in parsed.tool_calls] == ["f"]
    assert [(e.kind, e.call_index, e.message) for e in parsed.errors] == [
        ("unknown_tool", 1, "tool call 1: unknown tool 'rm_rf'")
    ]


@pytest.mark.parametrize(
    ("start_index", "strict", "kinds", "first"),
    [
        (0, False, [], 5),
        (5, False, [], 5),
        (5, True, [], 5),
        (0, True, ["bad_index", "bad_index"], 5),
        (5, True, [], 0),  # counted per turn: accepted too
        (7, True, ["bad_index", "bad_index"], 3),
    ],
)
def test_strict_ids(start_index: int, strict: bool, kinds: list[str], first: int) -> None:
    text = _section(_call_text(f"functions.f:{first}", "{}"), _call_text(f"functions.g:{first + 1}", "{}"))
    parsed = parse_assistant(text, start_index=start_index, strict_ids=strict)
    assert [error.kind for error in parsed.errors] == kinds
    assert len(parsed.tool_calls) == 2 - len(kinds)


# ---------------------------------------------------------------------------- property tests

_PLAIN_TEXT = st.text(max_size=40).filter(lambda text: not any(token in text for token in SPECIAL_TOKENS))
_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | _PLAIN_TEXT,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(_PLAIN_TEXT, children, max_size=3),
    max_leaves=8,
)
_NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.\-]{0,15}", fullmatch=True)


@st.composite
def _assistant_turns(draw: st.DrawFn) -> tuple[Message, int]:
    start_index = draw(st.integers(0, 50))
    names = draw(st.lists(_NAMES, max_size=3))
    calls = [
        ToolCall(
            id=f"functions.{name}:{start_index + i}",
            name=name,
            arguments=draw(st.dictionaries(_PLAIN_TEXT, _JSON_VALUES, max_size=4)),
        )
        for i, name in enumerate(names)
    ]
    reasoning = draw(st.none() | _PLAIN_TEXT)
    message = Message(role="assistant", content=draw(_PLAIN_TEXT), reasoning=reasoning, tool_calls=calls)
    return message, start_index


@settings(max_examples=200, deadline=None)
@given(turn=_assistant_turns(), closed=st.booleans())
def test_render_then_parse_round_trips(turn: tuple[Message, int], closed: bool) -> None:
    message, start_index = turn
    text = render_assistant_body(message) + (IM_END if closed else "")
    parsed = parse_assistant(
        text,
        start_index=start_index,
        strict_ids=True,
        known_tools={c.name for c in message.tool_calls},
    )
    assert parsed.errors == []
    assert parsed.to_message() == message.model_copy(update={"reasoning": None})  # instruct renders no reasoning


@settings(max_examples=200, deadline=None)
@given(turn=_assistant_turns(), closed=st.booleans())
def test_thinking_turn_after_the_prompts_think_round_trips(turn: tuple[Message, int], closed: bool) -> None:
    """Thinking: the model writes after the generation prompt's `<think>`: reasoning, `</think>`, the answer."""
    message, start_index = turn
    written = render_assistant_body(message, "thinking").removeprefix("<think>") + (IM_END if closed else "")
    parsed = parse_assistant(written, start_index=start_index, strict_ids=True, thinking=True)
    assert parsed.errors == []
    assert parsed.to_message() == message.model_copy(update={"reasoning": message.reasoning or ""})


_FRAGMENTS = st.sampled_from(
    [
        *SPECIAL_TOKENS,
        "functions.",
        "f",
        ":0",
        ":x",
        "{",
        "}",
        "[",
        "]",
        '"',
        ",",
        ":",
        " ",
        "\n",
        "1",
        '{"a": 1}',
        "null",
        "[" * 50,
    ]
)
_NOISY_TEXT = st.lists(st.one_of(_FRAGMENTS, st.text(max_size=4)), max_size=40).map("".join)


@settings(max_examples=300, deadline=None)
@given(
    text=_NOISY_TEXT,
    start_index=st.integers(-3, 10),
    strict=st.booleans(),
    known=st.none() | st.just({"f"}),
)
def test_parse_never_raises(text: str, start_index: int, strict: bool, known: set[str] | None) -> None:
    parsed = parse_assistant(text, start_index=start_index, known_tools=known, strict_ids=strict, thinking=strict)
    assert all(isinstance(call.arguments, dict) for call in parsed.tool_calls)
    assert all(error.message for error in parsed.errors)
    parsed.to_message()
    for error in parsed.errors:
        error.to_tool_message()


@pytest.mark.parametrize("text", ["[" * 100_000, '{"a": ' * 50_000, "1" * 10_000, "\ud800", ""])
def test_parse_survives_pathological_arguments(text: str) -> None:
    parsed = parse_assistant(_section(_call_text("functions.f:0", text)))
    assert parsed.tool_calls == [] and len(parsed.errors) == 1


# What deployed K2 parsers failed on (reported in their trackers): each parses here.
DEPLOYED_FAILURES = {
    "think_not_closed_before_calls": (
        "<think>I should look it up" + _section(_call_text("functions.f:0", '{"a": 1}')),
        "I should look it up",
        "",
        ["f"],
        ["unterminated_think"],
    ),
    "singular_section_spelling": (
        "<think>r</think>ok<|tool_call_section_begin|>"
        + _call_text("functions.f:0", "{}")
        + "<|tool_call_section_end|>",
        "r",
        "ok",
        ["f"],
        [],
    ),
    "several_calls_one_section": (
        "<think>r</think>" + _section(*(_call_text(f"functions.t{i}:{i}", f'{{"i": {i}}}') for i in range(5))),
        "r",
        "",
        ["t0", "t1", "t2", "t3", "t4"],
        [],
    ),
    "raw_tags_in_content": (
        "<think>r</think>Done.<|tool_call_end|> Bye<|tool_calls_section_end|>",
        "r",
        "Done. Bye",
        [],
        ["leaked_tags"],
    ),
    "index_not_counting_up": (
        _section(_call_text("functions.f:7", "{}"), _call_text("functions.g:3", "{}")),
        None,
        "",
        ["f", "g"],
        [],
    ),
}


@pytest.mark.parametrize("case", list(DEPLOYED_FAILURES), ids=list(DEPLOYED_FAILURES))
def test_deployed_parser_failures_parse(case: str) -> None:
    from k2post.chat.parse import SOFT_ERRORS

    text, reasoning, content, names, kinds = DEPLOYED_FAILURES[case]
    parsed = parse_assistant(text)
    assert parsed.reasoning == reasoning and parsed.content == content
    assert [call.name for call in parsed.tool_calls] == names
    assert [error.kind for error in parsed.errors] == kinds
    assert all(error.kind in SOFT_ERRORS for error in parsed.errors)  # nothing to hand back to the model


@pytest.mark.parametrize("case", list(DEPLOYED_FAILURES), ids=list(DEPLOYED_FAILURES))
def test_deployed_parser_failures_parse_after_the_thinking_prompt(case: str) -> None:
    """The same texts as the thinking format's model writes them: the prompt supplied the `<think>`."""
    text, reasoning, content, names, kinds = DEPLOYED_FAILURES[case]
    parsed = parse_assistant(text.removeprefix("<think>"), thinking=True)
    assert parsed.reasoning == (reasoning if reasoning is not None else "")
    assert parsed.content == content and [call.name for call in parsed.tool_calls] == names
    unclosed = [] if case != "index_not_counting_up" else ["unterminated_think"]  # no </think>: all is reasoning
    if unclosed:
        assert parsed.reasoning == "" and [e.kind for e in parsed.errors] == unclosed
    else:
        assert [error.kind for error in parsed.errors] == kinds


def test_calls_whose_index_does_not_count_up_are_renumbered_when_rendered() -> None:
    from k2post.chat.template import render_text

    parsed = parse_assistant(_section(_call_text("functions.f:7", "{}"), _call_text("functions.g:3", "{}")))
    text = render_text([Message(role="user", content="go"), parsed.to_message()])
    assert "functions.f:0" in text and "functions.g:1" in text and ":7" not in text
    assert [e.kind for e in parse_assistant(text.split("assistant<|im_middle|>")[1], strict_ids=True).errors] == []
