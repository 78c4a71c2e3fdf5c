"""K2 chat templates as shipped (instruct, thinking): exact bytes, token ids + assistant mask, HF Jinja equality,
format detection, id helpers."""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from transformers import PreTrainedTokenizerFast

from k2post.chat.template import (
    CHAT_FORMATS,
    CHAT_TEMPLATES,
    GENERATION_PROMPTS,
    assign_tool_call_ids,
    chat_format,
    render_assistant_body,
    render_ids,
    render_text,
    validate_dialogue,
)
from k2post.chat.tokens import IM_END, SPECIAL_TOKENS, THINK_BEGIN
from k2post.chat.types import Message, ToolCall, ToolSpec, dialogue_from_openai, dump_json

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
    Message(role="tool", tool_call_id="functions.get_weather:0", content="-3 C", name="get_weather"),
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
TOOL_LOOP = [  # a plain answer (1), then a tool loop (3, 4) that a user message (5) interrupts
    Message(role="user", content="Weather?"),
    Message(role="assistant", reasoning="Ask which city.", content="Which city?"),
    Message(role="user", content="Oslo"),
    Message(role="assistant", reasoning="Look it up.", tool_calls=[_call("get_weather", 0, city="Oslo")]),
    Message(role="tool", tool_call_id="functions.get_weather:0", content="-3 C", name="get_weather"),
    Message(role="user", content="Hurry up"),
]
LOOP_ANSWERED = [*TOOL_LOOP, Message(role="assistant", reasoning="Answer now.", content="Cold.")]

DIALOGUES: dict[str, tuple[list[Message], list[ToolSpec] | None]] = {
    "user_only": (USER_ONLY, None),
    "with_system": (WITH_SYSTEM, None),
    "reasoning": (REASONING, None),
    "empty_reasoning": (EMPTY_REASONING, None),
    "tool_round": (TOOL_ROUND, [WEATHER, SEARCH]),
    "tools_no_calls": (WITH_SYSTEM, [WEATHER]),
    "tool_loop": (TOOL_LOOP, [WEATHER]),
    "loop_answered": (LOOP_ANSWERED, [WEATHER]),
}

# Exact bytes of K2's shipped templates (K2-Instruct / K2-Thinking chat_template, as public renderings show them).
KIMI = "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>"
WEATHER_DECLARED = (
    '<|im_system|>tool_declare<|im_middle|>[{"type":"function","function":{"name":"get_weather",'
    '"description":"Weather in a city.","parameters":{"type":"object","properties":{"city":{"type":"string"}},'
    '"required":["city"]}}}]<|im_end|>'
)
OSLO_CALL = (
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
    '{"city": "Oslo"}<|tool_call_end|><|tool_calls_section_end|>'
)
GOLDEN: list[tuple[str, list[Message], list[ToolSpec] | None, bool, str, str]] = [
    ("plain", USER_ONLY, None, False, "instruct", KIMI + "<|im_user|>user<|im_middle|>Hi!<|im_end|>"),
    (
        "generation_prompt",
        USER_ONLY,
        None,
        True,
        "instruct",
        KIMI + "<|im_user|>user<|im_middle|>Hi!<|im_end|><|im_assistant|>assistant<|im_middle|>",
    ),
    (
        "thinking_generation_prompt",
        USER_ONLY,
        None,
        True,
        "thinking",
        KIMI + "<|im_user|>user<|im_middle|>Hi!<|im_end|><|im_assistant|>assistant<|im_middle|><think>",
    ),
    (
        "own_system",
        WITH_SYSTEM,
        None,
        False,
        "thinking",
        "<|im_system|>system<|im_middle|>Be brief.<|im_end|><|im_user|>user<|im_middle|>2+2?<|im_end|>",
    ),
    (
        "instruct_drops_reasoning",
        REASONING,
        None,
        False,
        "instruct",
        KIMI + "<|im_user|>user<|im_middle|>2+2?<|im_end|><|im_assistant|>assistant<|im_middle|>4<|im_end|>",
    ),
    (
        "thinking_last_answer_is_history",
        REASONING,
        None,
        False,
        "thinking",
        KIMI
        + "<|im_user|>user<|im_middle|>2+2?<|im_end|><|im_assistant|>assistant<|im_middle|><think></think>4<|im_end|>",
    ),
    (
        "tools_calls_named_results",
        TOOL_ROUND[1:5],
        [WEATHER],
        False,
        "instruct",
        WEATHER_DECLARED + KIMI + "<|im_user|>user<|im_middle|>Weather in Oslo and Lima? 東京 too.<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><|tool_calls_section_begin|>"
        '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Oslo"}<|tool_call_end|>'
        '<|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>{"city": "Lima"}<|tool_call_end|>'
        "<|tool_calls_section_end|><|im_end|>"
        "<|im_system|>get_weather<|im_middle|>## Return of functions.get_weather:0\n-3 C<|im_end|>"
        "<|im_system|>tool<|im_middle|>## Return of functions.get_weather:1\n19 C<|im_end|>",
    ),
    (
        "thinking_tool_loop_after_plain_answer_user_interrupts",
        TOOL_LOOP,
        [WEATHER],
        True,
        "thinking",
        WEATHER_DECLARED + KIMI + "<|im_user|>user<|im_middle|>Weather?<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think></think>Which city?<|im_end|>"
        "<|im_user|>user<|im_middle|>Oslo<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think>Look it up.</think>" + OSLO_CALL + "<|im_end|>"
        "<|im_system|>get_weather<|im_middle|>## Return of functions.get_weather:0\n-3 C<|im_end|>"
        "<|im_user|>user<|im_middle|>Hurry up<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think>",
    ),
    (
        "thinking_loop_closed_by_plain_answer",
        LOOP_ANSWERED,
        [WEATHER],
        False,
        "thinking",
        WEATHER_DECLARED + KIMI + "<|im_user|>user<|im_middle|>Weather?<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think></think>Which city?<|im_end|>"
        "<|im_user|>user<|im_middle|>Oslo<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think></think>" + OSLO_CALL + "<|im_end|>"
        "<|im_system|>get_weather<|im_middle|>## Return of functions.get_weather:0\n-3 C<|im_end|>"
        "<|im_user|>user<|im_middle|>Hurry up<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think></think>Cold.<|im_end|>",
    ),
    ("empty_dialogue", [], None, True, "instruct", KIMI + "<|im_assistant|>assistant<|im_middle|>"),
]


@pytest.mark.parametrize(
    ("messages", "tools", "generation_prompt", "fmt", "expected"),
    [case[1:] for case in GOLDEN],
    ids=[case[0] for case in GOLDEN],
)
def test_render_text_exact(
    messages: list[Message], tools: list[ToolSpec] | None, generation_prompt: bool, fmt: str, expected: str
) -> None:
    assert render_text(messages, tools=tools, add_generation_prompt=generation_prompt, chat_format=fmt) == expected


@pytest.mark.parametrize(
    ("messages", "tools", "generation_prompt", "fmt", "expected"),
    [case[1:] for case in GOLDEN if case[1]],
    ids=[case[0] for case in GOLDEN if case[1]],  # transformers refuses an empty dialogue,
)
def test_jinja_renders_the_golden_bytes(
    k2_tokenizer, messages: list[Message], tools, generation_prompt: bool, fmt: str, expected: str
) -> None:
    """The saved HF template (what vLLM's chat endpoint and apply_chat_template use) gives the same bytes."""
    openai_tools = [tool.to_openai() for tool in tools] if tools else None
    dicts = [message.to_openai() for message in messages]
    text = k2_tokenizer.apply_chat_template(
        dicts,
        tools=openai_tools,
        tokenize=False,
        add_generation_prompt=generation_prompt,
        chat_template=CHAT_TEMPLATES[fmt],
    )
    assert text == expected


def test_last_turn_open_renders_the_trained_answer_as_written() -> None:
    """An SFT row's final answer: the split is taken over the messages before it (what the model saw)."""
    text = render_text(LOOP_ANSWERED, [WEATHER], chat_format="thinking", last_turn_open=True)
    assert text.endswith(
        "<|im_assistant|>assistant<|im_middle|><think>Look it up.</think>" + OSLO_CALL + "<|im_end|>"
        "<|im_system|>get_weather<|im_middle|>## Return of functions.get_weather:0\n-3 C<|im_end|>"
        "<|im_user|>user<|im_middle|>Hurry up<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think>Answer now.</think>Cold.<|im_end|>"
    )
    prompt = render_text(TOOL_LOOP, [WEATHER], add_generation_prompt=True, chat_format="thinking")
    assert text == prompt + "Answer now.</think>Cold.<|im_end|>"  # prompt + what the model writes


@pytest.mark.parametrize("name", sorted(DIALOGUES))
@pytest.mark.parametrize("generation_prompt", [False, True])
def test_render_ids_matches_plain_tokenization(fmt_tokenizer, name: str, generation_prompt: bool) -> None:
    fmt, tokenizer = fmt_tokenizer
    messages, tools = DIALOGUES[name]
    rendered = render_ids(tokenizer, messages, tools=tools, add_generation_prompt=generation_prompt)
    assert rendered.text == render_text(messages, tools=tools, add_generation_prompt=generation_prompt, chat_format=fmt)
    assert rendered.input_ids == tokenizer(rendered.text, add_special_tokens=False).input_ids
    assert len(rendered.assistant_mask) == len(rendered.input_ids)


def _expected_trained_text(messages: list[Message], fmt: str, last_turn_open: bool = False) -> str:
    """Assistant bodies the mask covers, after the assistant header (thinking: after its `<think>`); in thinking,
    messages up to the last assistant message without calls (taken before the last message when it is open) whose
    non-empty reasoning is hidden are not trained."""
    scope = messages[:-1] if last_turn_open and messages and messages[-1].role == "assistant" else messages
    split = max((i for i, m in enumerate(scope) if m.role == "assistant" and not m.tool_calls), default=-1)
    texts = []
    for i, m in enumerate(messages):
        if m.role != "assistant" or (fmt == "thinking" and m.reasoning and i <= split):
            continue
        thinking = f"{m.reasoning or ''}</think>" if fmt == "thinking" else ""
        texts.append(thinking + render_assistant_body(m) + IM_END)
    return "".join(texts)


@pytest.mark.parametrize("name", sorted(DIALOGUES))
def test_assistant_mask_covers_bodies_and_im_end(fmt_tokenizer, name: str) -> None:
    fmt, tokenizer = fmt_tokenizer
    messages, tools = DIALOGUES[name]
    for last_turn_open in (False, True):
        rendered = render_ids(
            tokenizer, messages, tools=tools, add_generation_prompt=True, last_turn_open=last_turn_open
        )
        trained = [token for token, bit in zip(rendered.input_ids, rendered.assistant_mask, strict=True) if bit]
        # the tokenizer NFC-normalizes (Qwen2-style pipeline), so compare normalized text
        expected = _expected_trained_text(messages, fmt, last_turn_open)
        assert tokenizer.decode(trained) == unicodedata.normalize("NFC", expected)
        untrained = [token for token, bit in zip(rendered.input_ids, rendered.assistant_mask, strict=True) if not bit]
        assert tokenizer.decode(untrained).endswith(GENERATION_PROMPTS[fmt])  # the prompt's <think> is not trained


def test_thinking_mask_hides_the_answered_loop_and_trains_the_open_one(k2_thinking_tokenizer) -> None:
    """The split is the last assistant message without calls: the interrupted loop's reasoning (3) is trained, the
    plain answer's (1) is not; once answered (6), all of it is history unless the answer is the open turn."""

    def trained(messages, last_turn_open=False):
        rendered = render_ids(k2_thinking_tokenizer, messages, tools=[WEATHER], last_turn_open=last_turn_open)
        return k2_thinking_tokenizer.decode([t for t, bit in zip(rendered.input_ids, rendered.assistant_mask) if bit])

    assert trained(TOOL_LOOP) == "Look it up.</think>" + OSLO_CALL + "<|im_end|>"
    assert trained(LOOP_ANSWERED) == ""
    assert trained(LOOP_ANSWERED, last_turn_open=True) == (
        "Look it up.</think>" + OSLO_CALL + "<|im_end|>Answer now.</think>Cold.<|im_end|>"
    )


@pytest.mark.parametrize("fmt", CHAT_FORMATS)
def test_mask_starts_right_after_assistant_header(fmt_tokenizer, fmt: str) -> None:
    fmt, tokenizer = fmt_tokenizer
    rendered = render_ids(tokenizer, REASONING, last_turn_open=True)
    header = tokenizer(GENERATION_PROMPTS[fmt], add_special_tokens=False).input_ids
    start = next(i for i in range(len(rendered.input_ids)) if rendered.input_ids[i : i + len(header)] == header)
    first_trained = rendered.assistant_mask.index(1)
    assert first_trained == start + len(header)
    assert (tokenizer.convert_ids_to_tokens(rendered.input_ids[first_trained - 1]) == THINK_BEGIN) == (
        fmt == "thinking"
    )
    assert rendered.input_ids[-1] == tokenizer.convert_tokens_to_ids(IM_END)
    assert rendered.assistant_mask[-1] == 1


def test_chat_format_tells_the_variant_and_refuses_a_foreign_template(k2_tokenizer, k2_thinking_tokenizer) -> None:
    assert chat_format(k2_tokenizer) == "instruct" and chat_format(k2_thinking_tokenizer) == "thinking"
    foreign = CHAT_TEMPLATES["instruct"].replace("<|im_end|>", "<|im_end|>\n")
    for template, found in ((foreign, "not one of k2post's K2 templates"), (None, "no chat template")):
        tokenizer = type("Tok", (), {"chat_template": template})()
        with pytest.raises(ValueError, match=re.escape(found) + ".*run `k2post model prepare`"):
            chat_format(tokenizer)
    with pytest.raises(ValueError, match="run `k2post model prepare`"):
        render_ids(type("Tok", (), {"chat_template": foreign})(), USER_ONLY)


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
    fmt_tokenizer, name: str, generation_prompt: bool, arguments_as_dict: bool
) -> None:
    fmt, tokenizer = fmt_tokenizer
    messages, tools = DIALOGUES[name]
    openai_tools = [tool.to_openai() for tool in tools] if tools else None
    jinja_text = tokenizer.apply_chat_template(
        _openai_dialogue(messages, arguments_as_dict),
        tools=openai_tools,
        tokenize=False,
        add_generation_prompt=generation_prompt,
    )
    assert jinja_text == render_text(messages, tools=tools, add_generation_prompt=generation_prompt, chat_format=fmt)


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


# ---------------------------------------------------------------------------- OpenAI call ids -> K2 ids

_CALL_ID_IN_TEXT = re.compile(re.escape("<|tool_call_begin|>") + "(.*?)" + re.escape("<|tool_call_argument_begin|>"))
_RESULT_ID_IN_TEXT = re.compile("## Return of (.*)\n")


def _call_ids(text: str) -> list[str]:
    return _CALL_ID_IN_TEXT.findall(text)


def _result_ids(text: str) -> list[str]:
    return _RESULT_ID_IN_TEXT.findall(text)


def _oa_call(call_id: str | None, name: str, **arguments: Any) -> dict[str, Any]:
    call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": dump_json(arguments)}}
    return call if call_id is None else {"id": call_id, **call}


def _oa_assistant(*calls: dict[str, Any], content: str | None = None) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "tool_calls": list(calls)}


def _oa_result(call_id: str, content: str = "ok") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


_GO = {"role": "user", "content": "Go"}

# name -> (OpenAI dialogue, rendered call ids, rendered result ids)
OPENAI_ID_CASES: dict[str, tuple[list[dict[str, Any]], list[str], list[str]]] = {
    "call_abc123": (
        [_GO, _oa_assistant(_oa_call("call_abc123", "get_weather", city="Oslo")), _oa_result("call_abc123")],
        ["functions.get_weather:0"],
        ["functions.get_weather:0"],
    ),
    "reused_across_turns": (
        [
            _GO,
            _oa_assistant(_oa_call("call_1", "f", a=1), content="first"),
            _oa_result("call_1", "F"),
            _oa_assistant(_oa_call("call_1", "g")),
            _oa_result("call_1", "G"),
            {"role": "assistant", "content": "done"},
        ],
        ["functions.f:0", "functions.g:1"],
        ["functions.f:0", "functions.g:1"],
    ),
    "parallel_answered_out_of_order": (
        [
            _GO,
            _oa_assistant(_oa_call("call_a", "f"), _oa_call("call_b", "g", q="x"), _oa_call("call_c", "f")),
            _oa_result("call_c"),
            _oa_result("call_a"),
            _oa_result("call_b"),
        ],
        ["functions.f:0", "functions.g:1", "functions.f:2"],
        ["functions.f:2", "functions.f:0", "functions.g:1"],
    ),
    "parallel_same_id": (
        [_GO, _oa_assistant(_oa_call("dup", "f"), _oa_call("dup", "g")), _oa_result("dup")],
        ["functions.f:0", "functions.g:1"],
        ["functions.g:1"],
    ),
    "already_k2": (
        [
            _GO,
            _oa_assistant(_oa_call("functions.f:0", "f"), _oa_call("functions.g:1", "g")),
            _oa_result("functions.g:1"),
            _oa_assistant(_oa_call("functions.f:2", "f")),
            _oa_result("functions.f:2"),
        ],
        ["functions.f:0", "functions.g:1", "functions.f:2"],
        ["functions.g:1", "functions.f:2"],
    ),
    "k2_per_turn_index": (
        [
            _GO,
            _oa_assistant(_oa_call("functions.f:0", "f")),
            _oa_result("functions.f:0"),
            _oa_assistant(_oa_call("functions.g:0", "g"), _oa_call("functions.g:1", "g")),
            _oa_result("functions.g:1"),
            _oa_result("functions.g:0"),
        ],
        ["functions.f:0", "functions.g:0", "functions.g:1"],
        ["functions.f:0", "functions.g:1", "functions.g:0"],
    ),
    "k2_wrong_index_and_name": (
        [
            _GO,
            _oa_assistant(_oa_call("functions.f:7", "f"), _oa_call("functions.other:0", "g")),
            _oa_result("functions.f:7"),
            _oa_result("functions.other:0"),
        ],
        ["functions.f:0", "functions.g:1"],
        ["functions.f:0", "functions.g:1"],
    ),
    "missing_and_openai_ids": (
        [
            _GO,
            _oa_assistant(_oa_call(None, "f"), _oa_call("call_9", "g")),
            _oa_result("call_9"),
            _oa_result("functions.f:0"),
            _oa_assistant(_oa_call("", "h")),
            _oa_result("functions.h:2"),
        ],
        ["functions.f:0", "functions.g:1", "functions.h:2"],
        ["functions.g:1", "functions.f:0", "functions.h:2"],
    ),
}


def _arguments_as_dicts(dialogue: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            **data,
            "tool_calls": [
                {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                for c in data["tool_calls"]
            ],
        }
        if data.get("tool_calls")
        else data
        for data in dialogue
    ]


@pytest.mark.parametrize("name", sorted(OPENAI_ID_CASES))
@pytest.mark.parametrize("arguments_as_dict", [False, True])
@pytest.mark.parametrize("with_tools", [False, True])
def test_openai_ids_render_as_k2_ids_in_jinja_and_python(
    k2_tokenizer: PreTrainedTokenizerFast, name: str, arguments_as_dict: bool, with_tools: bool
) -> None:
    dialogue, call_ids, result_ids = OPENAI_ID_CASES[name]
    dialogue = _arguments_as_dicts(dialogue) if arguments_as_dict else dialogue
    tools = [WEATHER.to_openai()] if with_tools else None
    jinja_text = k2_tokenizer.apply_chat_template(dialogue, tools=tools, tokenize=False, add_generation_prompt=True)
    assert jinja_text == render_text(dialogue, tools=tools, add_generation_prompt=True)
    assert jinja_text == render_ids(k2_tokenizer, dialogue, tools=tools, add_generation_prompt=True).text
    assert (_call_ids(jinja_text), _result_ids(jinja_text)) == (call_ids, result_ids)
    k2_dialogue = assign_tool_call_ids(dialogue)
    validate_dialogue(k2_dialogue, require_k2_ids=True)
    assert assign_tool_call_ids(k2_dialogue) == k2_dialogue  # idempotent
    k2_dicts = [message.to_openai() for message in k2_dialogue]
    assert k2_tokenizer.apply_chat_template(k2_dicts, tools=tools, tokenize=False, add_generation_prompt=True) == (
        jinja_text
    )


def test_k2_ids_are_rendered_unchanged() -> None:
    messages, tools = DIALOGUES["tool_round"]
    assert assign_tool_call_ids(messages) == messages
    text = render_text(messages, tools=tools)
    assert _call_ids(text) == [call.id for message in messages for call in message.tool_calls]
    assert _result_ids(text) == [message.tool_call_id for message in messages if message.role == "tool"]


def test_require_k2_still_rejects_openai_ids_before_rendering() -> None:
    dialogue = dialogue_from_openai(OPENAI_ID_CASES["call_abc123"][0])
    with pytest.raises(ValueError, match="tool call id 'call_abc123' should be 'functions.get_weather:0'"):
        validate_dialogue(dialogue, require_k2_ids=True)
    assert _call_ids(render_text(dialogue)) == ["functions.get_weather:0"]  # the renderer rewrites it


@pytest.mark.parametrize(
    ("dialogue", "result_ids", "error"),
    [
        (
            [_GO, _oa_assistant(_oa_call("call_a", "f")), _oa_result("call_a"), _oa_result("call_zzz")],
            ["functions.f:0", "call_zzz"],
            "message 3: tool result for 'call_zzz' answers no earlier tool call",
        ),
        (
            [_GO, _oa_result("call_a"), _oa_assistant(_oa_call("call_a", "f"))],
            ["call_a"],
            "message 1: tool result for 'call_a' answers no earlier tool call",
        ),
        (
            [_GO, _oa_assistant(_oa_call("call_a", "f")), _oa_result("functions.f:0")],
            ["functions.f:0"],
            "message 2: tool result for 'functions.f:0' answers no earlier tool call",
        ),
    ],
    ids=["unknown_id", "result_before_call", "k2_id_of_an_openai_call"],
)
def test_unanswered_result_keeps_its_id_in_jinja_and_raises_in_python(
    k2_tokenizer: PreTrainedTokenizerFast, dialogue: list[dict[str, Any]], result_ids: list[str], error: str
) -> None:
    assert _result_ids(k2_tokenizer.apply_chat_template(dialogue, tokenize=False)) == result_ids
    with pytest.raises(ValueError, match=re.escape(error)):
        render_text(dialogue)
    with pytest.raises(ValueError, match=re.escape(error)):
        render_ids(k2_tokenizer, dialogue)


def test_chat_template_is_the_tokenizers(k2_tokenizer, k2_thinking_tokenizer) -> None:
    assert k2_tokenizer.chat_template == CHAT_TEMPLATES["instruct"]
    assert k2_thinking_tokenizer.chat_template == CHAT_TEMPLATES["thinking"]


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
            [Message(role="assistant", tool_calls=[_call("f", 0), _call("f", 0)])],
            "message 0: tool call id 'functions.f:0' is used twice",
        ),
    ],
    ids=["unknown_call", "result_before_call", "duplicate_id"],
)
def test_validate_dialogue_rejects(messages: list[Message], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        validate_dialogue(messages)
    if "tool result" in error:  # the renderers raise for unanswered results; repeated ids get renumbered
        with pytest.raises(ValueError, match=error):
            render_text(messages)
    else:
        assert _call_ids(render_text(messages)) == ["functions.f:0", "functions.f:1"]


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


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=_dialogues(), with_tools=st.booleans())
def test_render_ids_property(fmt_tokenizer, messages: list[Message], with_tools: bool) -> None:
    fmt, tokenizer = fmt_tokenizer
    tools = [WEATHER] if with_tools else None
    rendered = render_ids(tokenizer, messages, tools=tools, add_generation_prompt=True)
    assert rendered.input_ids == tokenizer(rendered.text, add_special_tokens=False).input_ids
    trained = [token for token, bit in zip(rendered.input_ids, rendered.assistant_mask, strict=True) if bit]
    # the tokenizer NFC-normalizes (Qwen2-style pipeline), so compare normalized text
    assert tokenizer.decode(trained) == unicodedata.normalize("NFC", _expected_trained_text(messages, fmt))
    validate_dialogue(messages, require_k2_ids=True)
    assert (
        tokenizer.apply_chat_template(
            [m.to_openai() for m in messages],
            tools=[WEATHER.to_openai()] if with_tools else None,
            tokenize=False,
            add_generation_prompt=True,
        )
        == rendered.text
    )


_OPENAI_IDS = st.sampled_from(["call_1", "call_2", "call_abc123", "functions.f:0", "functions.g:1", ""])


@st.composite
def _openai_id_dialogues(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Dialogues whose call ids are arbitrary (reused, K2-looking, missing); results answer given ids."""
    dialogue: list[dict[str, Any]] = []
    answerable: list[str] = []
    for _ in range(draw(st.integers(1, 3))):
        dialogue.append({"role": "user", "content": draw(_PLAIN_TEXT)})
        names = draw(st.lists(st.sampled_from(["f", "g", "h"]), min_size=1, max_size=3))
        calls = [_oa_call(draw(_OPENAI_IDS), name) for name in names]
        dialogue.append(_oa_assistant(*calls, content=draw(_PLAIN_TEXT)))
        answerable += [
            c.get("id") or f"functions.{c['function']['name']}:{len(answerable) + i}" for i, c in enumerate(calls)
        ]
        answered = draw(st.lists(st.sampled_from(answerable), max_size=3))
        dialogue.extend(_oa_result(call_id, draw(_PLAIN_TEXT)) for call_id in answered)
    return dialogue


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dialogue=_openai_id_dialogues())
def test_openai_ids_property(k2_tokenizer: PreTrainedTokenizerFast, dialogue: list[dict[str, Any]]) -> None:
    jinja_text = k2_tokenizer.apply_chat_template(dialogue, tokenize=False)
    k2_dialogue = assign_tool_call_ids(dialogue)
    validate_dialogue(k2_dialogue, require_k2_ids=True)
    assert jinja_text == render_text(dialogue) == render_text(k2_dialogue)
    assert _call_ids(jinja_text) == [call.id for message in k2_dialogue for call in message.tool_calls]


def test_per_turn_k2_ids_are_kept_and_parsed_results_point_at_the_latest(fmt_tokenizer) -> None:
    """Some public renderers count IDX per assistant turn: such ids are kept as written (not rewritten, not
    rejected); a result answers the latest earlier call with its id."""
    fmt, tokenizer = fmt_tokenizer
    dialogue = [
        _GO,
        _oa_assistant(_oa_call("functions.f:0", "f"), _oa_call("functions.g:1", "g")),
        _oa_result("functions.f:0", "F0"),
        _oa_result("functions.g:1", "G1"),
        _oa_assistant(_oa_call("functions.f:0", "f"), _oa_call("functions.f:1", "f")),
        _oa_result("functions.f:1", "F3"),
        _oa_result("functions.f:0", "F2"),
    ]
    text = render_text(dialogue, chat_format=fmt)
    assert _call_ids(text) == ["functions.f:0", "functions.g:1", "functions.f:0", "functions.f:1"]
    assert _result_ids(text) == ["functions.f:0", "functions.g:1", "functions.f:1", "functions.f:0"]
    assert tokenizer.apply_chat_template(dialogue, tokenize=False) == text
    k2_dialogue = assign_tool_call_ids(dialogue)
    validate_dialogue(k2_dialogue, require_k2_ids=True)
    assert assign_tool_call_ids(k2_dialogue) == k2_dialogue
