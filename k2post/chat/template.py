"""The K2 chat template: dialogue -> text, dialogue -> token ids + assistant loss mask.

Format (K2 as shipped; docs/CHAT_TEMPLATE.md); every message reads
`<|im_begin|>{role}<|im_middle|>{body}<|im_end|>`:

- tools, when given, come first as role `tool_declare`, body = JSON list of OpenAI tool entries;
- assistant body = optional `<think>{reasoning}</think>`, then content, then, when it calls
  tools, `<|tool_calls_section_begin|>` + per call `<|tool_call_begin|>functions.NAME:IDX
  <|tool_call_argument_begin|>{JSON arguments}<|tool_call_end|>` + `<|tool_calls_section_end|>`
  (IDX counts calls from 0 across the dialogue);
- tool body = `## Return of {tool_call_id}\\n{content}`; system/user body = content;
- generation prompt = `<|im_begin|>assistant<|im_middle|>`.

Reasoning across turns (K2 Thinking): an assistant message before the last user message is history and
renders its reasoning as an empty `<think></think>`; the messages of the current exchange (after the last
user message: the tool-calling turns and their results) keep theirs. The loss mask agrees with that view: a
history message whose reasoning was hidden gets mask 0 (training on it would teach answers without the
reasoning that produced them); give each exchange its own row to train it.

Call ids are always rendered in K2 form: both renderers rewrite any other id (OpenAI's `call_abc123`)
to `functions.NAME:IDX` and point each tool result at the K2 id of the call it answers
(`assign_tool_call_ids`); K2 ids with the right index are kept as they are.

JSON is `types.dump_json` everywhere, which equals HF's Jinja `tojson`, so `CHAT_TEMPLATE_JINJA`
(for `tokenizer.apply_chat_template`) renders exactly what `render_text` renders.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from k2post.chat.tokens import (
    IM_BEGIN,
    IM_END,
    IM_MIDDLE,
    SPECIAL_TOKENS,
    THINK_BEGIN,
    THINK_END,
    TOOL_CALL_ARG_BEGIN,
    TOOL_CALL_BEGIN,
    TOOL_CALL_END,
    TOOL_CALLS_BEGIN,
    TOOL_CALLS_END,
)
from k2post.chat.types import (
    Message,
    ToolCall,
    ToolSpec,
    dialogue_from_openai,
    dump_json,
    format_call_id,
)

TOOL_DECLARE_ROLE = "tool_declare"
TOOL_RESULT_PREFIX = "## Return of "
GENERATION_PROMPT = f"{IM_BEGIN}assistant{IM_MIDDLE}"

MessageLike = Message | dict[str, Any]
ToolLike = ToolSpec | dict[str, Any]


def as_messages(messages: Sequence[MessageLike]) -> list[Message]:
    """Messages as `Message`s; OpenAI dicts are converted (missing call ids get K2 ids)."""
    if all(isinstance(message, Message) for message in messages):
        return list(messages)  # type: ignore[arg-type]
    dicts = [m.to_openai() if isinstance(m, Message) else m for m in messages]
    return dialogue_from_openai(dicts)


def as_tools(tools: Sequence[ToolLike] | None) -> list[ToolSpec]:
    """Tool specs from `ToolSpec`s or OpenAI / MCP tool dicts."""
    return [tool if isinstance(tool, ToolSpec) else ToolSpec.from_openai(tool) for tool in tools or []]


def render_tool_calls(tool_calls: Sequence[ToolCall]) -> str:
    """The tool-call section of an assistant body ('' when there are no calls)."""
    if not tool_calls:
        return ""
    calls = "".join(
        f"{TOOL_CALL_BEGIN}{call.id}{TOOL_CALL_ARG_BEGIN}{dump_json(call.arguments)}{TOOL_CALL_END}"
        for call in tool_calls
    )
    return f"{TOOL_CALLS_BEGIN}{calls}{TOOL_CALLS_END}"


def render_assistant_body(message: Message, hide_reasoning: bool = False) -> str:
    """`<think>reasoning</think>` (when reasoning is not None; empty when `hide_reasoning`) + content + tool-call
    section."""
    if message.reasoning is None:
        thinking = ""
    else:
        thinking = f"{THINK_BEGIN}{'' if hide_reasoning else message.reasoning}{THINK_END}"
    return thinking + message.content + render_tool_calls(message.tool_calls)


def history_end(messages: Sequence[Message]) -> int:
    """Index of the last user message: assistant messages before it are history (reasoning hidden); 0 if none."""
    users = [index for index, message in enumerate(messages) if message.role == "user"]
    return users[-1] if users else 0


def hides_reasoning(messages: Sequence[Message], index: int) -> bool:
    """Whether message `index` renders its reasoning hidden: an assistant message with reasoning, in the history."""
    message = messages[index]
    return message.role == "assistant" and message.reasoning is not None and index < history_end(messages)


def render_body(message: Message, hide_reasoning: bool = False) -> str:
    """The text between `<|im_middle|>` and `<|im_end|>` of one message."""
    if message.role == "assistant":
        return render_assistant_body(message, hide_reasoning)
    if message.role == "tool":
        return f"{TOOL_RESULT_PREFIX}{message.tool_call_id}\n{message.content}"
    return message.content


def render_tool_declare_body(tools: Sequence[ToolSpec]) -> str:
    """JSON list of the OpenAI `tools` entries."""
    return dump_json([tool.to_openai() for tool in tools])


def _framed_bodies(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> list[tuple[str, str, bool]]:
    """`(role, body, trained)` of every framed message, the tool declaration first; `trained` is false for a
    history message whose reasoning is hidden (`hides_reasoning`)."""
    framed = [(TOOL_DECLARE_ROLE, render_tool_declare_body(tools), True)] if tools else []
    for index, message in enumerate(messages):
        hidden = hides_reasoning(messages, index)
        framed.append((message.role, render_body(message, hidden), not hidden))
    return framed


def render_text(
    messages: Sequence[MessageLike],
    tools: Sequence[ToolLike] | None = None,
    add_generation_prompt: bool = False,
) -> str:
    """The dialogue as K2 text, call ids rewritten to K2 form (`assign_tool_call_ids`, which raises
    ValueError when a tool result answers no earlier call)."""
    checked = assign_tool_call_ids(messages)
    text = "".join(
        f"{IM_BEGIN}{role}{IM_MIDDLE}{body}{IM_END}" for role, body, _ in _framed_bodies(checked, as_tools(tools))
    )
    return text + (GENERATION_PROMPT if add_generation_prompt else "")


def _unanswered(position: int, message: Message) -> str:
    """Error text for a tool result that answers no earlier call."""
    return f"message {position}: tool result for {message.tool_call_id!r} answers no earlier tool call"


def validate_dialogue(messages: Sequence[Message], require_k2_ids: bool = False) -> None:
    """Raise ValueError (naming the message index) when a tool result answers no earlier call,
    a call id repeats, or, with `require_k2_ids`, an id is not `functions.NAME:IDX` with IDX
    the dialogue-wide call counter."""
    seen_ids: set[str] = set()
    for position, message in enumerate(messages):
        if message.role == "tool" and message.tool_call_id not in seen_ids:
            raise ValueError(_unanswered(position, message))
        for call in message.tool_calls:
            expected = format_call_id(call.name, len(seen_ids))
            if require_k2_ids and call.id != expected:
                raise ValueError(f"message {position}: tool call id {call.id!r} should be {expected!r}")
            if call.id in seen_ids:
                raise ValueError(f"message {position}: tool call id {call.id!r} is used twice")
            seen_ids.add(call.id)


def assign_tool_call_ids(messages: Sequence[MessageLike]) -> list[Message]:
    """Copy of the dialogue with K2 call ids (`functions.NAME:IDX`, IDX dialogue-wide) and
    tool results re-pointed at the new ids (a reused old id means its latest call). Idempotent:
    a dialogue whose ids are already K2 ids with the right index comes back equal.
    Raises ValueError (naming the message index) for a result that answers no earlier call."""
    renamed: dict[str, str] = {}
    result: list[Message] = []
    call_count = 0
    for position, message in enumerate(as_messages(messages)):
        if message.role == "tool":
            if message.tool_call_id not in renamed:
                raise ValueError(_unanswered(position, message))
            message = message.model_copy(update={"tool_call_id": renamed[message.tool_call_id]})
        calls = []
        for call in message.tool_calls:
            new_id = format_call_id(call.name, call_count)
            renamed[call.id or new_id] = new_id  # an id-less call is answered by its K2 id
            calls.append(call.model_copy(update={"id": new_id}))
            call_count += 1
        result.append(message.model_copy(update={"tool_calls": calls}) if calls else message)
    return result


# ---------------------------------------------------------------------------- token ids


class ChatTokenizer(Protocol):
    """The slice of a HF tokenizer that `render_ids` uses."""

    def __call__(self, text: list[str], add_special_tokens: bool = ...) -> Any: ...

    def convert_tokens_to_ids(self, tokens: str) -> int | None: ...

    def convert_ids_to_tokens(self, ids: int) -> str | None: ...


@dataclass(frozen=True)
class RenderedChat:
    """Token ids of a rendered dialogue; `assistant_mask[i] == 1` where token i is trained on."""

    input_ids: list[int]
    assistant_mask: list[int]
    text: str


SPECIAL_TOKEN_SPLIT = re.compile("(" + "|".join(re.escape(token) for token in SPECIAL_TOKENS) + ")")


def _own_id(tokenizer: ChatTokenizer, token: str) -> int | None:
    """The tokenizer's id of `token`, or None when it has none (compared back rather than against unk: some
    tokenizer classes use a K2 token as unk)."""
    token_id = tokenizer.convert_tokens_to_ids(token)
    return token_id if token_id is not None and tokenizer.convert_ids_to_tokens(token_id) == token else None


def missing_special_tokens(tokenizer: ChatTokenizer) -> list[str]:
    """The K2 special tokens the tokenizer has no id for (what `k2post model prepare` adds)."""
    return [token for token in SPECIAL_TOKENS if _own_id(tokenizer, token) is None]


def special_token_ids(tokenizer: ChatTokenizer) -> dict[str, int]:
    """Id of every K2 special token; ValueError when the tokenizer lacks one."""
    missing = missing_special_tokens(tokenizer)
    if missing:
        raise ValueError(f"tokenizer has no id for special token {missing[0]!r} (`k2post model prepare` adds them)")
    return {token: _own_id(tokenizer, token) for token in SPECIAL_TOKENS}


def _labelled_segments(framed: Sequence[tuple[str, str, bool]], add_generation_prompt: bool) -> list[tuple[str, int]]:
    """Text segments with their mask bit: trained assistant bodies and their `<|im_end|>` get 1."""
    segments: list[tuple[str, int]] = []
    for role, body, trained in framed:
        segments.append((f"{IM_BEGIN}{role}{IM_MIDDLE}", 0))
        segments.append((body + IM_END, 1 if role == "assistant" and trained else 0))
    if add_generation_prompt:
        segments.append((GENERATION_PROMPT, 0))
    return segments


def _pieces(segments: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    """Segments split so that every special token is its own piece (empty pieces dropped)."""
    return [(piece, bit) for segment, bit in segments for piece in SPECIAL_TOKEN_SPLIT.split(segment) if piece]


def render_ids(
    tokenizer: ChatTokenizer,
    messages: Sequence[MessageLike],
    tools: Sequence[ToolLike] | None = None,
    add_generation_prompt: bool = False,
) -> RenderedChat:
    """Tokenize the dialogue piece by piece (special tokens atomic) and build the loss mask:
    1 on each assistant body and its closing `<|im_end|>` (history messages with hidden reasoning excepted),
    0 on headers and other roles.
    Call ids are rewritten to K2 form first, as in `render_text`."""
    checked = assign_tool_call_ids(messages)
    framed = _framed_bodies(checked, as_tools(tools))
    return _tokenize_pieces(tokenizer, _pieces(_labelled_segments(framed, add_generation_prompt)))


def render_transcript_ids(
    tokenizer: ChatTokenizer,
    messages: Sequence[Message],
    tools: Sequence[ToolLike] | None = None,
    add_generation_prompt: bool = True,
) -> RenderedChat:
    """`render_ids` of a rollout's dialogue as the model wrote it: call ids kept, results not validated (a rollout
    answers malformed calls with `functions.invalid:IDX` results); used to re-render an elided episode."""
    framed = _framed_bodies(list(messages), as_tools(tools))
    return _tokenize_pieces(tokenizer, _pieces(_labelled_segments(framed, add_generation_prompt)))


def render_continuation_ids(
    tokenizer: ChatTokenizer, messages: Sequence[Message], add_generation_prompt: bool = True
) -> RenderedChat:
    """Token ids of messages that continue an already tokenized dialogue (tool results, user
    replies in a rollout), framed exactly as `render_ids` frames them; the call ids they answer
    live in the earlier part, so they are neither validated nor rewritten here."""
    framed = [(message.role, render_body(message), True) for message in messages]
    return _tokenize_pieces(tokenizer, _pieces(_labelled_segments(framed, add_generation_prompt)))


def _tokenize_pieces(tokenizer: ChatTokenizer, pieces: Sequence[tuple[str, int]]) -> RenderedChat:
    """Ids and mask of labelled pieces: special tokens map to their id, the rest is tokenized."""
    special_ids = special_token_ids(tokenizer)
    plain = [piece for piece, _ in pieces if piece not in special_ids]
    plain_ids = iter(tokenizer(plain, add_special_tokens=False)["input_ids"] if plain else [])
    input_ids: list[int] = []
    assistant_mask: list[int] = []
    for piece, bit in pieces:
        piece_ids = [special_ids[piece]] if piece in special_ids else list(next(plain_ids))
        input_ids.extend(piece_ids)
        assistant_mask.extend([bit] * len(piece_ids))
    text = "".join(piece for piece, _ in pieces)
    return RenderedChat(input_ids=input_ids, assistant_mask=assistant_mask, text=text)


# ---------------------------------------------------------------------------- HF Jinja template

_JINJA_CONTENT_MACRO = (
    "{%- macro render_content(content) -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- elif content -%}{%- for part in content -%}"
    "{%- if part.type is not defined or part.type == 'text' -%}{{ part.text }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
)

_JINJA_REASONING = (
    "{%- set reasoning = message.reasoning_content -%}"
    "{%- if reasoning is not defined or reasoning is none -%}"
    "{%- set reasoning = message.reasoning -%}"
    "{%- endif -%}"
    "{%- if reasoning is defined and reasoning is not none -%}"
    "{%- if loop.index0 < history.end -%}"
    f"{THINK_BEGIN}{THINK_END}"
    "{%- else -%}"
    f"{THINK_BEGIN}{{{{ reasoning }}}}{THINK_END}"
    "{%- endif -%}"
    "{%- endif -%}"
)
"""Reasoning of messages before the last user message (`history.end`) renders as an empty think block."""

_JINJA_HISTORY_END = (
    "{%- set history = namespace(end=0) -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'user' -%}{%- set history.end = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
)

_JINJA_ARGUMENTS = (
    "{%- set arguments = function.arguments -%}"
    "{%- if arguments is string and arguments | trim -%}{{ arguments }}"
    "{%- elif arguments is mapping -%}{{ arguments | tojson }}"
    "{%- else -%}{}{%- endif -%}"
)

_JINJA_TOOL_CALLS = (
    "{%- if message.tool_calls -%}"
    f"{TOOL_CALLS_BEGIN}"
    "{%- for tool_call in message.tool_calls -%}"
    "{%- set function = tool_call.function if tool_call.function is defined else tool_call -%}"
    "{%- set call_id = 'functions.' ~ function.name ~ ':' ~ ns.call_index -%}"
    "{%- set ns.calls = ns.calls + [[tool_call.id if tool_call.id else call_id, call_id]] -%}"
    f"{TOOL_CALL_BEGIN}{{{{ call_id }}}}{TOOL_CALL_ARG_BEGIN}" + _JINJA_ARGUMENTS + f"{TOOL_CALL_END}"
    "{%- set ns.call_index = ns.call_index + 1 -%}"
    "{%- endfor -%}"
    f"{TOOL_CALLS_END}"
    "{%- endif -%}"
)

_JINJA_RESULT_ID = (
    "{%- set answered = namespace(id=message.tool_call_id) -%}"
    "{%- for given_id, k2_id in ns.calls -%}"
    "{%- if given_id == message.tool_call_id -%}{%- set answered.id = k2_id -%}{%- endif -%}"
    "{%- endfor -%}"
)
"""Sets `answered.id`: the K2 id of the latest earlier call with the tool message's id (the given id when none)."""

CHAT_TEMPLATE_JINJA: str = (
    _JINJA_CONTENT_MACRO + _JINJA_HISTORY_END + "{%- set ns = namespace(call_index=0, calls=[]) -%}"
    "{%- if tools -%}"
    f"{IM_BEGIN}{TOOL_DECLARE_ROLE}{IM_MIDDLE}{{{{ tools | tojson }}}}{IM_END}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    f"{IM_BEGIN}{{{{ message.role }}}}{IM_MIDDLE}"
    "{%- if message.role == 'assistant' -%}"
    + _JINJA_REASONING
    + "{{ render_content(message.content) }}"
    + _JINJA_TOOL_CALLS
    + "{%- elif message.role == 'tool' -%}"
    + _JINJA_RESULT_ID
    + f"{TOOL_RESULT_PREFIX}{{{{ answered.id }}}}{{{{ '\\n' }}}}"
    "{{ render_content(message.content) }}"
    "{%- else -%}{{ render_content(message.content) }}"
    "{%- endif -%}"
    f"{IM_END}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    f"{GENERATION_PROMPT}"
    "{%- endif -%}"
)
"""HF chat template rendering OpenAI-style dicts exactly like `render_text`. Every call is written
as `functions.NAME:IDX` (IDX dialogue-wide, whatever id it carries) and a tool result names the K2 id
of the latest earlier call with its `tool_call_id` (kept as given when no earlier call has it, where
`render_text` raises). Call arguments given as dicts are serialized with `tojson` (same as
`dump_json`); argument strings are copied verbatim, so they match `render_text` when already in
`dump_json` form."""
