"""K2 chat template: exact text, token ids + assistant mask, HF Jinja equality, id helpers."""

from __future__ import annotations

import unicodedata

import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from transformers import PreTrainedTokenizerFast

from k2post.chat.template import (
    CHAT_TEMPLATE_JINJA,
    GENERATION_PROMPT,
    assign_tool_call_ids,
    render_assistant_body,
    render_ids,
    render_text,
    validate_dialogue,
)
from k2post.chat.tokens import IM_END, SPECIAL_TOKENS
from k2post.chat.types import Message, ToolCall, ToolSpec, dialogue_from_openai

WEATHER = ToolSpec(
    name="get_weather",
    description="Weather in a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
SEARCH = ToolSpec(name="search", description="Søk på nettet.", parameters={"type": "object", "properties": {}})


def _call(name: str, index: int, **arguments: Any) -> ToolCall:
    return ToolCall(id=f"functions.{name}:{index}", name=name, arguments=arguments)


USER_ONLY = [Message(role="user", content="Hi!")]
WITH_SYSTEM = [Message(role="system", content="Be brief."), Message(role="user", content="2+2?")]
REASONING = [
    Message(role="user", content="2+2?"),
    Message(role="assistant", reasoning="Two plus two.", content="4"),
]
EMPTY_REASONING = [
    Message(role="user", content="x"),
    Message(role="assistant", reasoning="", content="y"),
]
TOOL_ROUND = [
    Message(role="system", content="You can call tools."),
    Message(role="user", content="Weather in Oslo and Lima? 東京 too."),
    Message(
        role="assistant",
        reasoning="Call the tool twice.",
        tool_calls=[_call("get_weather", 0, city="Oslo"), _call("get_weather", 1, city="Lima")],
    ),
    Message(role="tool", tool_call_id="functions.get_weather:0", content="-3 C"),
    Message(role="tool", tool_call_id="functions.get_weather:1", content="19 C"),
    Message(
        role="assistant",
        content="Checking more.",
        tool_calls=[_call("search", 2, q='東京 "weather"', n=[1, 2.5, None, True])],
    ),
    Message(role="tool", tool_call_id="functions.search:2", content='{"temp": 12}\nline two'),
    Message(role="assistant", content="Oslo -3 C, Lima 19 C, Tokyo 12 C."),
    Message(role="user", content="Thanks"),
]

DIALOGUES: dict[str, tuple[list[Message], list[ToolSpec] | None]] = {
    "user_only": (USER_ONLY, None),
    "with_system": (WITH_SYSTEM, None),
    "reasoning": (REASONING, None),
    "empty_reasoning": (EMPTY_REASONING, None),
    "tool_round": (TOOL_ROUND, [WEATHER, SEARCH]),
    "tools_no_calls": (WITH_SYSTEM, [WEATHER]),
}


@pytest.mark.parametrize(
    ("messages", "tools", "generation_prompt", "expected"),
    [
        (USER_ONLY, None, False, "<|im_begin|>user<|im_middle|>Hi!<|im_end|>"),
        (
            USER_ONLY,
            None,
            True,
            "<|im_begin|>user<|im_middle|>Hi!<|im_end|><|im_begin|>assistant<|im_middle|>",
        ),
        (
            REASONING,
            None,
            False,
            "<|im_begin|>user<|im_middle|>2+2?<|im_end|>"
            "<|im_begin|>assistant<|im_middle|><think>Two plus two.</think>4<|im_end|>",
        ),
        (
            TOOL_ROUND[1:4],
            [WEATHER],
            False,
            '<|im_begin|>tool_declare<|im_middle|>[{"type": "function", "function": {"name": "get_weather", '
            '"description": "Weather in a city.", "parameters": {"type": "object", "properties": '
            '{"city": {"type": "string"}}, "required": ["city"]}}}]<|im_end|>'
            "<|im_begin|>user<|im_middle|>Weather in Oslo and Lima? 東京 too.<|im_end|>"
            "<|im_begin|>assistant<|im_middle|><think>Call the tool twice.</think><|tool_calls_section_begin|>"
            '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Oslo"}<|tool_call_end|>'
            '<|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>{"city": "Lima"}<|tool_call_end|>'
            "<|tool_calls_section_end|><|im_end|>"
            "<|im_begin|>tool<|im_middle|>## Return of functions.get_weather:0\n-3 C<|im_end|>",
        ),
    ],
    ids=["user", "user_generation_prompt", "reasoning", "tool_call"],
)
def test_render_text_exact(
    messages: list[Message], tools: list[ToolSpec] | None, generation_prompt: bool, expected: str
) -> None:
    assert render_text(messages, tools=tools, add_generation_prompt=generation_prompt) == expected


@pytest.mark.parametrize("name", sorted(DIALOGUES))
@pytest.mark.parametrize("generation_prompt", [False, True])
def test_render_ids_matches_plain_tokenization(
    k2_tokenizer: PreTrainedTokenizerFast, name: str, generation_prompt: bool
) -> None:
    messages, tools = DIALOGUES[name]
    rendered = render_ids(k2_tokenizer, messages, tools=tools, add_generation_prompt=generation_prompt)
    assert rendered.text == render_text(messages, tools=tools, add_generation_prompt=generation_prompt)
    assert rendered.input_ids == k2_tokenizer(rendered.text, add_special_tokens=False).input_ids
    assert len(rendered.assistant_mask) == len(rendered.input_ids)


def _expected_trained_text(messages: list[Message]) -> str:
    return "".join(render_assistant_body(m) + IM_END for m in messages if m.role == "assistant")


@pytest.mark.parametrize("name", sorted(DIALOGUES))
def test_assistant_mask_covers_bodies_and_im_end(k2_tokenizer: PreTrainedTokenizerFast, name: str) -> None:
    messages, tools = DIALOGUES[name]
    rendered = render_ids(k2_tokenizer, messages, tools=tools, add_generation_prompt=True)
    trained = [token for token, bit in zip(rendered.input_ids, rendered.assistant_mask, strict=True) if bit]
    # the tokenizer NFC-normalizes (Qwen2-style pipeline), so compare normalized text
    assert k2_tokenizer.decode(trained) == unicodedata.normalize("NFC", _expected_trained_text(messages))
    untrained = [token for token, bit in zip(rendered.input_ids, rendered.assistant_mask, strict=True) if not bit]
    assert k2_tokenizer.decode(untrained).endswith(GENERATION_PROMPT)


def test_mask_starts_right_after_assistant_header(k2_tokenizer: PreTrainedTokenizerFast) -> None:
    rendered = render_ids(k2_tokenizer, REASONING)
    header = k2_tokenizer("<|im_begin|>assistant<|im_middle|>", add_special_tokens=False).input_ids
    start = next(i for i in range(len(rendered.input_ids)) if rendered.input_ids[i : i + len(header)] == header)
    first_trained = rendered.assistant_mask.index(1)
    assert first_trained == start + len(header)
    assert rendered.input_ids[-1] == k2_tokenizer.convert_tokens_to_ids(IM_END)
    assert rendered.assistant_mask[-1] == 1


def _openai_dialogue(messages: list[Message], arguments_as_dict: bool) -> list[dict[str, Any]]:
    dicts = [message.to_openai() for message in messages]
    if arguments_as_dict:
        for data, message in zip(dicts, messages, strict=True):
            for call_dict, call in zip(data.get("tool_calls", []), message.tool_calls, strict=True):
                call_dict["function"]["arguments"] = call.arguments
    return dicts


@pytest.mark.parametrize("name", sorted(DIALOGUES))
@pytest.mark.parametrize("generation_prompt", [False, True])
@pytest.mark.parametrize("arguments_as_dict", [False, True])
def test_jinja_template_equals_render_text(
    k2_tokenizer: PreTrainedTokenizerFast,
    name: str,
    generation_prompt: bool,
    arguments_as_dict: bool,
) -> None:
    messages, tools = DIALOGUES[name]
    openai_tools = [tool.to_openai() for tool in tools] if tools else None
    jinja_text = k2_tokenizer.apply_chat_template(
        _openai_dialogue(messages, arguments_as_dict),
        tools=openai_tools,
        tokenize=False,
        add_generation_prompt=generation_prompt,
    )
    assert jinja_text == render_text(messages, tools=tools, add_generation_prompt=generation_prompt)


def test_jinja_fills_missing_call_ids_like_python(k2_tokenizer: PreTrainedTokenizerFast) -> None:
    dialogue = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Go"}, {"type": "text", "text": "!"}],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"type": "function", "function": {"name": "a", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "functions.a:0", "content": "ok"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "b", "arguments": {"x": 1}}}],
        },
    ]
    jinja_text = k2_tokenizer.apply_chat_template(dialogue, tokenize=False)
    assert jinja_text == render_text(dialogue)
    assert "functions.b:1<|tool_call_argument_begin|>" in jinja_text
    assert [m.tool_calls[0].id for m in dialogue_from_openai(dialogue) if m.tool_calls] == [
        "functions.a:0",
        "functions.b:1",
    ]


def test_chat_template_is_the_tokenizers(k2_tokenizer: PreTrainedTokenizerFast) -> None:
    assert k2_tokenizer.chat_template == CHAT_TEMPLATE_JINJA


@pytest.mark.parametrize(
    ("messages", "error"),
    [
        (
            [Message(role="user", content="x"), Message(role="tool", tool_call_id="functions.f:0")],
            "message 1: tool result",
        ),
        (
            [
                Message(role="tool", tool_call_id="functions.f:0"),
                Message(role="assistant", tool_calls=[_call("f", 0)]),
            ],
            "message 0: tool result",
        ),
        (
            [
                Message(role="assistant", tool_calls=[_call("f", 0)]),
                Message(role="assistant", tool_calls=[_call("f", 0)]),
            ],
            "message 1: tool call id 'functions.f:0' is used twice",
        ),
    ],
    ids=["unknown_call", "result_before_call", "duplicate_id"],
)
def test_validate_dialogue_rejects(messages: list[Message], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        validate_dialogue(messages)
    with pytest.raises(ValueError, match=error):
        render_text(messages)


def test_validate_dialogue_k2_ids() -> None:
    validate_dialogue(TOOL_ROUND, require_k2_ids=True)
    wrong_index = [Message(role="assistant", tool_calls=[_call("f", 3)])]
    validate_dialogue(wrong_index)
    with pytest.raises(
        ValueError,
        match=re.escape("message 0: tool call id 'functions.f:3' should be 'functions.f:0'"),
    ):
        validate_dialogue(wrong_index, require_k2_ids=True)


def test_assign_tool_call_ids_renumbers_and_repoints() -> None:
    dialogue = [
        Message(role="user", content="go"),
        Message(
            role="assistant",
            tool_calls=[ToolCall(id="call_a", name="f"), ToolCall(id="call_b", name="g")],
        ),
        Message(role="tool", tool_call_id="call_b", content="B"),
        Message(role="tool", tool_call_id="call_a", content="A"),
        Message(role="assistant", tool_calls=[ToolCall(id="call_a", name="h", arguments={"k": 1})]),
        Message(role="tool", tool_call_id="call_a", content="H"),
    ]
    fixed = assign_tool_call_ids(dialogue)
    assert [c.id for m in fixed for c in m.tool_calls] == [
        "functions.f:0",
        "functions.g:1",
        "functions.h:2",
    ]
    assert [m.tool_call_id for m in fixed if m.role == "tool"] == [
        "functions.g:1",
        "functions.f:0",
        "functions.h:2",
    ]
    validate_dialogue(fixed, require_k2_ids=True)
    with pytest.raises(ValueError, match="message 1: tool result for 'nope'"):
        assign_tool_call_ids([Message(role="user"), Message(role="tool", tool_call_id="nope")])


@pytest.mark.parametrize(
    "fields",
    [
        {"role": "user", "tool_calls": [ToolCall(id="functions.f:0", name="f")]},
        {"role": "tool", "content": "no id"},
        {"role": "user", "tool_call_id": "functions.f:0"},
        {"role": "system", "reasoning": "hm"},
        {"role": "developer", "content": "x"},
    ],
    ids=["calls_on_user", "tool_without_id", "id_on_user", "reasoning_on_system", "unknown_role"],
)
def test_message_validation(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        Message(**fields)


def test_message_openai_round_trip_and_argument_strings() -> None:
    for message in TOOL_ROUND:
        assert Message.from_openai(message.to_openai()) == message
    data = {
        "role": "assistant",
        "content": None,
        "reasoning": "r",
        "tool_calls": [
            {
                "id": "functions.f:0",
                "type": "function",
                "function": {"name": "f", "arguments": '{"a":[1,2]}'},
            }
        ],
    }
    message = Message.from_openai(data)
    assert message.content == "" and message.reasoning == "r"
    assert message.tool_calls == [ToolCall(id="functions.f:0", name="f", arguments={"a": [1, 2]})]
    with pytest.raises(ValueError, match="JSON object"):
        Message.from_openai(
            {
                "role": "assistant",
                "tool_calls": [{"id": "x", "function": {"name": "f", "arguments": "[1]"}}],
            }
        )


def test_tool_spec_from_openai_and_mcp() -> None:
    assert ToolSpec.from_openai(WEATHER.to_openai()) == WEATHER
    mcp = {
        "name": "get_weather",
        "description": "Weather in a city.",
        "inputSchema": WEATHER.parameters,
    }
    assert ToolSpec.from_openai(mcp) == WEATHER


# ---------------------------------------------------------------------------- property tests

_PLAIN_TEXT = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=30).filter(
    lambda text: not any(token in text for token in SPECIAL_TOKENS)
)
_NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)
_ARGUMENTS = st.dictionaries(_PLAIN_TEXT, st.one_of(st.integers(), _PLAIN_TEXT, st.booleans(), st.none()), max_size=3)


@st.composite
def _dialogues(draw: st.DrawFn) -> list[Message]:
    messages: list[Message] = []
    call_count = 0
    for _ in range(draw(st.integers(1, 4))):
        messages.append(Message(role="user", content=draw(_PLAIN_TEXT)))
        names = draw(st.lists(_NAMES, max_size=2))
        calls = [
            ToolCall(id=f"functions.{n}:{call_count + i}", name=n, arguments=draw(_ARGUMENTS))
            for i, n in enumerate(names)
        ]
        call_count += len(calls)
        reasoning = draw(st.one_of(st.none(), _PLAIN_TEXT))
        messages.append(Message(role="assistant", content=draw(_PLAIN_TEXT), reasoning=reasoning, tool_calls=calls))
        messages.extend(Message(role="tool", tool_call_id=c.id, content=draw(_PLAIN_TEXT)) for c in calls)
    return messages


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=_dialogues(), with_tools=st.booleans())
def test_render_ids_property(k2_tokenizer: PreTrainedTokenizerFast, messages: list[Message], with_tools: bool) -> None:
    tools = [WEATHER] if with_tools else None
    rendered = render_ids(k2_tokenizer, messages, tools=tools, add_generation_prompt=True)
    assert rendered.input_ids == k2_tokenizer(rendered.text, add_special_tokens=False).input_ids
    trained = [token for token, bit in zip(rendered.input_ids, rendered.assistant_mask, strict=True) if bit]
    # the tokenizer NFC-normalizes (Qwen2-style pipeline), so compare normalized text
    assert k2_tokenizer.decode(trained) == unicodedata.normalize("NFC", _expected_trained_text(messages))
    validate_dialogue(messages, require_k2_ids=True)
    assert (
        k2_tokenizer.apply_chat_template(
            [m.to_openai() for m in messages],
            tools=[WEATHER.to_openai()] if with_tools else None,
            tokenize=False,
            add_generation_prompt=True,
        )
        == rendered.text
    )
