"""The K2 chat template as shipped: dialogue -> text, dialogue -> token ids + assistant loss mask, HF Jinja.

Two shipped variants, told apart by the tokenizer's chat_template (`chat_format`): "instruct" (K2-Instruct) and
"thinking" (K2-Thinking). Every message reads `{start}{name}<|im_middle|>{body}<|im_end|>`, where start is
`<|im_user|>` (user), `<|im_assistant|>` (assistant) or `<|im_system|>` (every other role) and name is
`message.name or message.role`:

- tools, when given, come first as `<|im_system|>tool_declare<|im_middle|>{tools as compact JSON}<|im_end|>`;
- when the dialogue does not start with a system message, `DEFAULT_SYSTEM_PROMPT` is injected as one (after the
  tool declaration);
- assistant body = content, then, when it calls tools, `<|tool_calls_section_begin|>` + per call
  `<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{JSON arguments}<|tool_call_end|>` +
  `<|tool_calls_section_end|>`; thinking prefixes `<think>{reasoning}</think>` (below);
- tool body = `## Return of {tool_call_id}\\n{content}`; system/user body = content;
- generation prompt = `<|im_assistant|>assistant<|im_middle|>` (thinking: then `<think>`).

Reasoning (thinking only; instruct renders none): the dialogue splits at its last assistant message without tool
calls (`history_split`); assistant messages up to and including it render an empty `<think></think>`, those after
it (the current tool loop) `<think>{reasoning}</think>`. The loss mask agrees: a history message whose non-empty
reasoning was hidden gets 0 (training on it would teach an answer without the reasoning that produced it), and the
`<think>` of an assistant header is the generation prompt's, never trained. An SFT row's final answer is trained as
the model wrote it (`last_turn_open`: the split is taken over the messages before it).

Call ids: ids k2post assigns are `functions.NAME:IDX` with IDX dialogue-wide; both renderers rewrite other ids
(OpenAI's `call_abc123`) to that and point each tool result at the new id (`assign_tool_call_ids`); a K2 id whose
index counts per turn or per dialogue is kept as written.

Call arguments are `types.dump_json` (HF's Jinja default `tojson`), the tool list `dump_compact_json`, so
`CHAT_TEMPLATES[fmt]` (for `tokenizer.apply_chat_template`) renders exactly what `render_text` renders.

Untrusted text: only the renderer's own tokens are structure. `render_ids` (and the transcript / continuation
variants) tokenize every other part (`Part`) with `split_special_tokens=True`, so `<|im_end|>` written inside a
message gives ordinary ids, never a real turn. A text (`render_text`, the Jinja template) cannot tell the two apart:
it is for display, tokenizer training and comparison; prompts go to an in-process engine as `render_ids` ids, and
an LLM client that must send text (an OpenAI-compatible server re-tokenizes the rendered prompt) sends message
contents through `tokens.defuse_special_tokens` first.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, get_args

from k2post.chat.tokens import (
    CHAT_TOKENS,
    IM_ASSISTANT,
    IM_END,
    IM_MIDDLE,
    IM_SYSTEM,
    IM_USER,
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
    dump_compact_json,
    dump_json,
    format_call_id,
    split_call_id,
)

ChatFormat = Literal["instruct", "thinking"]
CHAT_FORMATS: tuple[str, ...] = get_args(ChatFormat)
TOOL_DECLARE_NAME = "tool_declare"
TOOL_RESULT_PREFIX = "## Return of "
DEFAULT_SYSTEM_PROMPT = "You are Kimi, an AI assistant created by Moonshot AI."

MessageLike = Message | dict[str, Any]
ToolLike = ToolSpec | dict[str, Any]


def message_start(role: str) -> str:
    """The token that opens a message of `role`."""
    return {"user": IM_USER, "assistant": IM_ASSISTANT}.get(role, IM_SYSTEM)


def header(role: str, name: str | None = None) -> str:
    """`{start}{name or role}<|im_middle|>`."""
    return f"{message_start(role)}{name or role}{IM_MIDDLE}"


def generation_prompt(chat_format: ChatFormat) -> str:
    """What the model continues from: the assistant header, and `<think>` in the thinking format."""
    return header("assistant") + (THINK_BEGIN if chat_format == "thinking" else "")


GENERATION_PROMPTS: dict[str, str] = {fmt: generation_prompt(fmt) for fmt in CHAT_FORMATS}


def as_messages(messages: Sequence[MessageLike]) -> list[Message]:
    """Messages as `Message`s; OpenAI dicts are converted (missing call ids get K2 ids)."""
    if all(isinstance(message, Message) for message in messages):
        return list(messages)  # type: ignore[arg-type]
    dicts = [m.to_openai() if isinstance(m, Message) else m for m in messages]
    return dialogue_from_openai(dicts)


def as_tools(tools: Sequence[ToolLike] | None) -> list[ToolSpec]:
    """Tool specs from `ToolSpec`s or OpenAI / MCP tool dicts."""
    return [tool if isinstance(tool, ToolSpec) else ToolSpec.from_openai(tool) for tool in tools or []]


def check_chat_format(chat_format: str) -> ChatFormat:
    """`chat_format` itself, or a one-line ValueError naming the known formats."""
    if chat_format not in CHAT_FORMATS:
        raise ValueError(f"chat format {chat_format!r} is not one of {', '.join(CHAT_FORMATS)}")
    return chat_format  # type: ignore[return-value]


# ---------------------------------------------------------------------------- bodies

Part = tuple[str, bool]
"""A piece of a rendered message: (text, whether it is one of the renderer's own special tokens). Only such parts
become special ids in `render_ids`; every other part (content, reasoning, names, call ids and arguments, tool
results, the tool declaration) is tokenized as plain text, so a special-token string inside it stays text."""


def _special(token: str) -> Part:
    return (token, True)


def _text(text: str) -> list[Part]:
    return [(text, False)] if text else []


def _joined(parts: Sequence[Part]) -> str:
    return "".join(text for text, _ in parts)


def header_parts(role: str, name: str | None = None) -> list[Part]:
    """`header` as parts: the start token, the name as text, `<|im_middle|>`."""
    return [_special(message_start(role)), *_text(name or role), _special(IM_MIDDLE)]


def tool_call_parts(tool_calls: Sequence[ToolCall]) -> list[Part]:
    """The tool-call section of an assistant body as parts (none when there are no calls)."""
    if not tool_calls:
        return []
    parts = [_special(TOOL_CALLS_BEGIN)]
    for call in tool_calls:
        parts += [_special(TOOL_CALL_BEGIN), *_text(call.id), _special(TOOL_CALL_ARG_BEGIN)]
        parts += [*_text(dump_json(call.arguments)), _special(TOOL_CALL_END)]
    return parts + [_special(TOOL_CALLS_END)]


def render_tool_calls(tool_calls: Sequence[ToolCall]) -> str:
    """The tool-call section of an assistant body ('' when there are no calls)."""
    return _joined(tool_call_parts(tool_calls))


def think_parts(message: Message, hide_reasoning: bool) -> list[Part]:
    """`think_block` as parts: the tags are special, the reasoning is text."""
    return [_special(THINK_BEGIN), *_text("" if hide_reasoning else message.reasoning or ""), _special(THINK_END)]


def think_block(message: Message, hide_reasoning: bool) -> str:
    """`<think>{reasoning or ''}</think>` of a thinking-format assistant message (empty when hidden)."""
    return _joined(think_parts(message, hide_reasoning))


def assistant_body_parts(
    message: Message, chat_format: ChatFormat = "instruct", hide_reasoning: bool = False
) -> list[Part]:
    """`render_assistant_body` as parts."""
    thinking = think_parts(message, hide_reasoning) if chat_format == "thinking" else []
    return [*thinking, *_text(message.content), *tool_call_parts(message.tool_calls)]


def render_assistant_body(message: Message, chat_format: ChatFormat = "instruct", hide_reasoning: bool = False) -> str:
    """Content + tool-call section; the thinking format puts `think_block` first (instruct renders no reasoning)."""
    return _joined(assistant_body_parts(message, chat_format, hide_reasoning))


def history_split(messages: Sequence[Message]) -> int:
    """Index of the last assistant message without tool calls (-1 if none): the thinking format hides the reasoning
    of every assistant message up to it."""
    plain = [i for i, message in enumerate(messages) if message.role == "assistant" and not message.tool_calls]
    return plain[-1] if plain else -1


def split_for(messages: Sequence[Message], last_turn_open: bool) -> int:
    """`history_split`, taken over the messages before the last one when `last_turn_open` and it is an assistant
    message (the turn being trained is rendered as the model wrote it: its reasoning visible)."""
    if last_turn_open and messages and messages[-1].role == "assistant":
        return history_split(messages[:-1])
    return history_split(messages)


def hides_reasoning(chat_format: ChatFormat, messages: Sequence[Message], index: int, split: int) -> bool:
    """Whether message `index` is an assistant message whose non-empty reasoning the thinking format hides."""
    message = messages[index]
    return chat_format == "thinking" and message.role == "assistant" and bool(message.reasoning) and index <= split


def body_parts(message: Message, chat_format: ChatFormat = "instruct", hide_reasoning: bool = False) -> list[Part]:
    """`render_body` as parts."""
    if message.role == "assistant":
        return assistant_body_parts(message, chat_format, hide_reasoning)
    if message.role == "tool":
        return _text(f"{TOOL_RESULT_PREFIX}{message.tool_call_id}\n{message.content}")
    return _text(message.content)


def render_body(message: Message, chat_format: ChatFormat = "instruct", hide_reasoning: bool = False) -> str:
    """The text between `<|im_middle|>` and `<|im_end|>` of one message."""
    return _joined(body_parts(message, chat_format, hide_reasoning))


def render_tool_declare_body(tools: Sequence[ToolSpec]) -> str:
    """Compact JSON list of the OpenAI `tools` entries."""
    return dump_compact_json([tool.to_openai() for tool in tools])


@dataclass(frozen=True)
class Framed:
    """One framed message: `head` (never trained), `body` (+ `<|im_end|>`, trained when `trained`), as parts."""

    head: tuple[Part, ...]
    body: tuple[Part, ...]
    trained: bool

    @property
    def text(self) -> str:
        """`{head}{body}<|im_end|>`."""
        return _joined(self.head) + _joined(self.body) + IM_END


def _frame(message: Message, chat_format: ChatFormat, hidden: bool) -> Framed:
    """A message framed; a thinking-format assistant's `<think>` goes with the head (the generation prompt's)."""
    head, body = header_parts(message.role, message.name), body_parts(message, chat_format, hidden)
    if message.role != "assistant":
        return Framed(tuple(head), tuple(body), False)
    if chat_format == "thinking":
        head, body = [*head, body[0]], body[1:]
    return Framed(tuple(head), tuple(body), not hidden)


def _system_frame(name: str, body: str) -> Framed:
    return Framed(tuple(header_parts("system", name)), tuple(_text(body)), False)


def framed_messages(
    messages: Sequence[Message],
    tools: Sequence[ToolSpec],
    chat_format: ChatFormat,
    last_turn_open: bool = False,
    prefix: bool = True,
) -> list[Framed]:
    """Every framed message: with `prefix`, the tool declaration and the default system prompt first."""
    framed = []
    if prefix and tools:
        framed.append(_system_frame(TOOL_DECLARE_NAME, render_tool_declare_body(tools)))
    if prefix and (not messages or messages[0].role != "system"):
        framed.append(_system_frame("system", DEFAULT_SYSTEM_PROMPT))
    split = split_for(messages, last_turn_open)
    for index, message in enumerate(messages):
        framed.append(_frame(message, chat_format, hides_reasoning(chat_format, messages, index, split)))
    return framed


def render_text(
    messages: Sequence[MessageLike],
    tools: Sequence[ToolLike] | None = None,
    add_generation_prompt: bool = False,
    chat_format: ChatFormat = "instruct",
    last_turn_open: bool = False,
) -> str:
    """The dialogue as K2 text in `chat_format`, call ids rewritten to K2 form (`assign_tool_call_ids`, which raises
    ValueError when a tool result answers no earlier call)."""
    checked = assign_tool_call_ids(messages)
    framed = framed_messages(checked, as_tools(tools), check_chat_format(chat_format), last_turn_open)
    text = "".join(item.text for item in framed)
    return text + (GENERATION_PROMPTS[chat_format] if add_generation_prompt else "")


# ---------------------------------------------------------------------------- call ids


def _unanswered(position: int, message: Message) -> str:
    """Error text for a tool result that answers no earlier call."""
    return f"message {position}: tool result for {message.tool_call_id!r} answers no earlier tool call"


def kept_call_id(call: ToolCall, dialogue_index: int, turn_index: int) -> bool:
    """Whether `call.id` is a K2 id of this call: `functions.NAME:IDX` with its name and IDX counted per dialogue
    (`dialogue_index`) or per assistant turn (`turn_index`)."""
    parts = split_call_id(call.id)
    return parts is not None and parts[0] == call.name and parts[1] in (dialogue_index, turn_index)


def validate_dialogue(messages: Sequence[Message], require_k2_ids: bool = False) -> None:
    """Raise ValueError (naming the message index) when a tool result answers no earlier call, a call id repeats
    within one turn, or, with `require_k2_ids`, an id is not `functions.NAME:IDX` with IDX counted per dialogue or
    per turn."""
    seen_ids: set[str] = set()
    count = 0
    for position, message in enumerate(messages):
        if message.role == "tool" and message.tool_call_id not in seen_ids:
            raise ValueError(_unanswered(position, message))
        turn_ids: set[str] = set()
        for ordinal, call in enumerate(message.tool_calls):
            if require_k2_ids and not kept_call_id(call, count, ordinal):
                expected = format_call_id(call.name, count)
                raise ValueError(f"message {position}: tool call id {call.id!r} should be {expected!r}")
            if call.id in turn_ids:
                raise ValueError(f"message {position}: tool call id {call.id!r} is used twice")
            turn_ids.add(call.id)
            count += 1
        seen_ids |= turn_ids


def _with_k2_ids(message: Message, first_index: int, renamed: dict[str, str]) -> Message:
    """`message` with every call id in K2 form (recorded in `renamed`, old id -> new id)."""
    calls: list[ToolCall] = []
    for ordinal, call in enumerate(message.tool_calls):
        index = first_index + ordinal
        keep = kept_call_id(call, index, ordinal) and call.id not in {done.id for done in calls}
        new_id = call.id if keep else format_call_id(call.name, index)
        renamed[call.id or new_id] = new_id  # an id-less call is answered by its K2 id
        calls.append(call.model_copy(update={"id": new_id}))
    return message.model_copy(update={"tool_calls": calls}) if calls else message


def assign_tool_call_ids(messages: Sequence[MessageLike]) -> list[Message]:
    """Copy of the dialogue with K2 call ids and tool results pointed at them (a reused old id means its latest
    call). Other ids become `functions.NAME:IDX`, IDX dialogue-wide; K2 ids with a per-dialogue or per-turn index
    are kept, unless the turn already used that id. Idempotent. Raises ValueError (naming the message index) for
    a result that answers no earlier call."""
    renamed: dict[str, str] = {}
    result: list[Message] = []
    call_count = 0
    for position, message in enumerate(as_messages(messages)):
        if message.role == "tool":
            if message.tool_call_id not in renamed:
                raise ValueError(_unanswered(position, message))
            message = message.model_copy(update={"tool_call_id": renamed[message.tool_call_id]})
        result.append(_with_k2_ids(message, call_count, renamed))
        call_count += len(message.tool_calls)
    return result


# ---------------------------------------------------------------------------- token ids


class ChatTokenizer(Protocol):
    """The slice of a HF tokenizer that `render_ids` uses."""

    chat_template: Any

    def __call__(self, text: list[str], add_special_tokens: bool = ..., split_special_tokens: bool = ...) -> Any: ...

    def convert_tokens_to_ids(self, tokens: str) -> int | None: ...

    def convert_ids_to_tokens(self, ids: int) -> str | None: ...


@dataclass(frozen=True)
class RenderedChat:
    """Token ids of a rendered dialogue; `assistant_mask[i] == 1` where token i is trained on."""

    input_ids: list[int]
    assistant_mask: list[int]
    text: str


SPECIAL_TOKEN_SPLIT = re.compile("(" + "|".join(re.escape(token) for token in SPECIAL_TOKENS) + ")")
"""Splits a text at every special-token string (tokenizer training treats them as atomic)."""


def _own_id(tokenizer: ChatTokenizer, token: str) -> int | None:
    """The tokenizer's id of `token`, or None when it has none (compared back rather than against unk: some
    tokenizer classes use a K2 token as unk)."""
    token_id = tokenizer.convert_tokens_to_ids(token)
    return token_id if token_id is not None and tokenizer.convert_ids_to_tokens(token_id) == token else None


def missing_special_tokens(tokenizer: ChatTokenizer, tokens: Sequence[str] = CHAT_TOKENS) -> list[str]:
    """The `tokens` (default: the K2 chat tokens) the tokenizer has no id for (what `k2post model prepare` adds)."""
    return [token for token in tokens if _own_id(tokenizer, token) is None]


def special_token_ids(tokenizer: ChatTokenizer) -> dict[str, int]:
    """Id of every K2 chat token; ValueError when the tokenizer lacks one."""
    missing = missing_special_tokens(tokenizer)
    if missing:
        raise ValueError(f"tokenizer has no id for special token {missing[0]!r} (`k2post model prepare` adds them)")
    return {token: _own_id(tokenizer, token) for token in CHAT_TOKENS}


def chat_format(tokenizer: Any) -> ChatFormat:
    """Which K2 format the tokenizer's chat_template is (exact match with `CHAT_TEMPLATES`); a one-line ValueError
    for any other template."""
    template = getattr(tokenizer, "chat_template", None)
    for name, jinja in CHAT_TEMPLATES.items():
        if template == jinja:
            return name  # type: ignore[return-value]
    found = "no chat template" if not template else "a chat template that is not one of k2post's K2 templates"
    raise ValueError(f"tokenizer has {found} ({', '.join(CHAT_FORMATS)}): run `k2post model prepare` on the model dir")


def generation_prompt_parts(chat_format: ChatFormat) -> list[Part]:
    """`generation_prompt` as parts."""
    return header_parts("assistant") + ([_special(THINK_BEGIN)] if chat_format == "thinking" else [])


def _labelled_parts(framed: Sequence[Framed], prompt: Sequence[Part]) -> list[tuple[str, bool, int]]:
    """(text, special, mask bit) of every part: trained assistant bodies and their `<|im_end|>` get 1; adjacent
    plain parts with the same bit are merged (tokenized as one text)."""
    labelled: list[tuple[str, bool, int]] = []
    for item in framed:
        labelled += [(text, special, 0) for text, special in item.head]
        labelled += [(text, special, int(item.trained)) for text, special in (*item.body, _special(IM_END))]
    labelled += [(text, special, 0) for text, special in prompt]
    merged: list[tuple[str, bool, int]] = []
    for text, special, bit in labelled:
        if merged and not special and not merged[-1][1] and merged[-1][2] == bit:
            text = merged.pop()[0] + text
        merged.append((text, special, bit))
    return merged


def _render_framed(tokenizer: ChatTokenizer, framed: Sequence[Framed], chat_format: ChatFormat | None) -> RenderedChat:
    prompt = generation_prompt_parts(chat_format) if chat_format else []
    return _tokenize_parts(tokenizer, _labelled_parts(framed, prompt))


def render_ids(
    tokenizer: ChatTokenizer,
    messages: Sequence[MessageLike],
    tools: Sequence[ToolLike] | None = None,
    add_generation_prompt: bool = False,
    last_turn_open: bool = False,
) -> RenderedChat:
    """Tokenize the dialogue in the tokenizer's format (`chat_format`) part by part and build the loss mask. Only
    the renderer's own structure (headers, `<|im_end|>`, the tool-call section tokens and think tags it writes)
    becomes special ids; a special-token string inside content, reasoning, names, call ids, arguments, tool results
    or the tool declaration is tokenized as plain text (untrusted text never becomes structure). The mask: 1 on
    each assistant body and its closing `<|im_end|>` (history messages with hidden reasoning excepted), 0 on
    headers (with thinking's `<think>`) and other roles. Call ids are rewritten to K2 form first, as in
    `render_text`; `last_turn_open` as there."""
    fmt = chat_format(tokenizer)
    checked = assign_tool_call_ids(messages)
    framed = framed_messages(checked, as_tools(tools), fmt, last_turn_open)
    return _render_framed(tokenizer, framed, fmt if add_generation_prompt else None)


def render_transcript_ids(
    tokenizer: ChatTokenizer,
    messages: Sequence[Message],
    tools: Sequence[ToolLike] | None = None,
    add_generation_prompt: bool = True,
) -> RenderedChat:
    """`render_ids` of a rollout's dialogue as the model wrote it: call ids kept, results not validated (a rollout
    answers malformed calls with `functions.invalid:IDX` results); used to re-render an elided episode."""
    fmt = chat_format(tokenizer)
    framed = framed_messages(list(messages), as_tools(tools), fmt)
    return _render_framed(tokenizer, framed, fmt if add_generation_prompt else None)


def render_continuation_ids(
    tokenizer: ChatTokenizer, messages: Sequence[Message], add_generation_prompt: bool = True
) -> RenderedChat:
    """Token ids of messages that continue an already tokenized dialogue (tool results, user replies in a
    rollout), framed exactly as `render_ids` frames them; the call ids they answer live in the earlier part, so
    they are neither validated nor rewritten here."""
    fmt = chat_format(tokenizer)
    framed = [_frame(message, fmt, False) for message in messages]
    return _render_framed(tokenizer, framed, fmt if add_generation_prompt else None)


def _check_plain(tokenizer: ChatTokenizer, encoded: Sequence[Sequence[int]], special: set[int]) -> None:
    """ValueError when a plain part got a chat token's id: the tokenizer ignored `split_special_tokens`, and text
    would become structure."""
    if any(token in special for ids in encoded for token in ids):
        raise ValueError(
            f"{type(tokenizer).__name__} ignores split_special_tokens=True: a special-token string in a message would "
            "become chat structure; use a Hugging Face fast tokenizer (`k2post model prepare` writes one)"
        )


def _tokenize_parts(tokenizer: ChatTokenizer, parts: Sequence[tuple[str, bool, int]]) -> RenderedChat:
    """Ids and mask of labelled parts: the renderer's special tokens map to their id; every other part is tokenized
    with `split_special_tokens=True`, so a special-token string in untrusted text gives ordinary ids."""
    special_ids = special_token_ids(tokenizer)
    plain = [text for text, special, _ in parts if not special]
    encoded = tokenizer(plain, add_special_tokens=False, split_special_tokens=True)["input_ids"] if plain else []
    _check_plain(tokenizer, encoded, set(special_ids.values()))
    plain_ids = iter(encoded)
    input_ids: list[int] = []
    assistant_mask: list[int] = []
    for text, special, bit in parts:
        part_ids = [special_ids[text]] if special else list(next(plain_ids))
        input_ids.extend(part_ids)
        assistant_mask.extend([bit] * len(part_ids))
    text = "".join(text for text, _, _ in parts)
    return RenderedChat(input_ids=input_ids, assistant_mask=assistant_mask, text=text)


# ---------------------------------------------------------------------------- HF Jinja templates

_JINJA_CONTENT_MACRO = (
    "{%- macro render_content(content) -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- elif content -%}{%- for part in content -%}"
    "{%- if part.type is not defined or part.type == 'text' -%}{{ part.text }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
)

_JINJA_SPLIT = (
    "{%- set split = namespace(index=-1) -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'assistant' and not message.tool_calls -%}{%- set split.index = loop.index0 -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
)
"""`split.index`: the last assistant message without tool calls (-1: none), as `history_split`."""

_JINJA_THINK = (
    "{%- set reasoning = message.reasoning_content -%}"
    "{%- if reasoning is not defined or reasoning is none -%}{%- set reasoning = message.reasoning -%}{%- endif -%}"
    f"{THINK_BEGIN}"
    "{%- if loop.index0 > split.index and reasoning is defined and reasoning is not none -%}{{ reasoning }}"
    "{%- endif -%}"
    f"{THINK_END}"
)
"""Thinking: the reasoning of messages after the split, an empty think block up to it."""

_JINJA_ARGUMENTS = (
    "{%- set arguments = function.arguments -%}"
    "{%- if arguments is string and arguments | trim -%}{{ arguments }}"
    "{%- elif arguments is mapping -%}{{ arguments | tojson }}"
    "{%- else -%}{}{%- endif -%}"
)

_JINJA_TOOL_CALLS = (
    "{%- if message.tool_calls -%}"
    f"{TOOL_CALLS_BEGIN}"
    "{%- set turn = namespace(ids=[]) -%}"
    "{%- for tool_call in message.tool_calls -%}"
    "{%- set function = tool_call.function if tool_call.function is defined else tool_call -%}"
    "{%- set wide_id = 'functions.' ~ function.name ~ ':' ~ ns.call_index -%}"
    "{%- set turn_id = 'functions.' ~ function.name ~ ':' ~ loop.index0 -%}"
    "{%- set keep = tool_call.id in [wide_id, turn_id] and tool_call.id not in turn.ids -%}"
    "{%- set call_id = tool_call.id if keep else wide_id -%}"
    "{%- set turn.ids = turn.ids + [call_id] -%}"
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

_JINJA_PREFIX = (
    "{%- set ns = namespace(call_index=0, calls=[]) -%}"
    "{%- if tools -%}"
    f"{IM_SYSTEM}{TOOL_DECLARE_NAME}{IM_MIDDLE}{{{{ tools | tojson(separators=(',', ':')) }}}}{IM_END}"
    "{%- endif -%}"
    "{%- if messages | length == 0 or messages[0].role != 'system' -%}"
    f"{IM_SYSTEM}system{IM_MIDDLE}{DEFAULT_SYSTEM_PROMPT}{IM_END}"
    "{%- endif -%}"
)

_JINJA_HEADER = (
    f"{{%- if message.role == 'user' -%}}{IM_USER}"
    f"{{%- elif message.role == 'assistant' -%}}{IM_ASSISTANT}"
    f"{{%- else -%}}{IM_SYSTEM}{{%- endif -%}}"
    f"{{{{ message.name or message.role }}}}{IM_MIDDLE}"
)


def _jinja(chat_format: ChatFormat) -> str:
    """The HF chat template of `chat_format`."""
    thinking = chat_format == "thinking"
    return (
        _JINJA_CONTENT_MACRO
        + (_JINJA_SPLIT if thinking else "")
        + _JINJA_PREFIX
        + "{%- for message in messages -%}"
        + _JINJA_HEADER
        + "{%- if message.role == 'assistant' -%}"
        + (_JINJA_THINK if thinking else "")
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
        f"{GENERATION_PROMPTS[chat_format]}"
        "{%- endif -%}"
    )


CHAT_TEMPLATES: dict[str, str] = {fmt: _jinja(fmt) for fmt in CHAT_FORMATS}
"""HF chat templates rendering OpenAI-style dicts exactly like `render_text(..., chat_format=fmt)`. A call whose id is
not a K2 id of it (per dialogue or per turn) is written `functions.NAME:IDX` (IDX dialogue-wide), and a tool result
names the K2 id of the latest earlier call with its `tool_call_id` (kept as given when no earlier call has it, where
`render_text` raises). Call arguments given as dicts are serialized with `tojson` (same as `dump_json`); argument
strings are copied verbatim, so they match `render_text` when already in `dump_json` form."""
