"""Typed chat messages, tool specs and tool calls, plus conversion from/to OpenAI dicts.

These are the values the K2 chat template renders (`k2post.chat.template`) and the
assistant parser produces (`k2post.chat.parse`). OpenAI-style chat dicts (what vLLM's
server and most datasets use) convert with `Message.from_openai` / `Message.to_openai`.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Role = Literal["system", "user", "assistant", "tool"]

JSON_SEPARATORS = (", ", ": ")
"""Separators of the JSON serialization of call arguments and data (same as HF's Jinja `tojson`)."""
COMPACT_SEPARATORS = (",", ":")
"""Separators of the tool declaration (K2's template: `tools | tojson(separators=(',', ':'))`)."""


def dump_json(value: Any) -> str:
    """The project's deterministic JSON text: key order kept, non-ASCII kept, `", "`/`": "`."""
    return json.dumps(value, ensure_ascii=False, separators=JSON_SEPARATORS)


def dump_compact_json(value: Any) -> str:
    """Compact JSON (no spaces), key order and non-ASCII kept: how K2 declares its tools."""
    return json.dumps(value, ensure_ascii=False, separators=COMPACT_SEPARATORS)


class ToolSpec(BaseModel):
    """A tool the model may call; `parameters` is a JSON schema (MCP / OpenAI style)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, description="Function name the model calls.")
    description: str = Field(default="", description="What the tool does.")
    parameters: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object", "properties": {}},
        description="JSON schema of the arguments object.",
    )

    def to_openai(self) -> dict[str, Any]:
        """OpenAI `tools` entry: `{"type": "function", "function": {...}}`."""
        function = {
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
        }
        return {"type": "function", "function": function}

    @classmethod
    def from_openai(cls, data: dict[str, Any]) -> ToolSpec:
        """Accept an OpenAI `tools` entry, or a bare function / MCP tool dict."""
        function = data.get("function", data)
        parameters = function.get("parameters", function.get("inputSchema"))
        fields: dict[str, Any] = {
            "name": function["name"],
            "description": function.get("description") or "",
        }
        if parameters is not None:
            fields["parameters"] = parameters
        return cls(**fields)


class ToolCall(BaseModel):
    """One call of a tool by the assistant; K2 ids read `functions.NAME:IDX`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(description="Call id, `functions.NAME:IDX` in K2 dialogues.")
    name: str = Field(min_length=1, description="Name of the called tool.")
    arguments: dict[str, Any] = Field(default_factory=dict, description="Arguments object.")

    def to_openai(self) -> dict[str, Any]:
        """OpenAI `tool_calls` entry, arguments as a JSON string (the OpenAI convention)."""
        function = {"name": self.name, "arguments": dump_json(self.arguments)}
        return {"id": self.id, "type": "function", "function": function}

    @classmethod
    def from_openai(cls, data: dict[str, Any], default_id: str = "") -> ToolCall:
        """Accept an OpenAI `tool_calls` entry; arguments may be a JSON string or a dict."""
        function = data.get("function", data)
        arguments = function.get("arguments") or {}
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except RecursionError:
                raise ValueError("tool call arguments are nested too deeply") from None
        if not isinstance(arguments, dict):
            raise ValueError(f"tool call arguments must be a JSON object, got {type(arguments).__name__}")
        return cls(id=data.get("id") or default_id, name=function["name"], arguments=arguments)


CALL_ID_PATTERN = re.compile(r"functions\.(?P<name>\S+):(?P<index>[0-9]+)")
"""K2 tool call id: `functions.NAME:IDX`; IDX counts calls from 0 across the dialogue in the ids k2post assigns, and
within one assistant turn in some public renderers (both are read and kept)."""


def format_call_id(name: str, index: int) -> str:
    """The K2 id of the `index`-th call (dialogue-wide) of tool `name`."""
    return f"functions.{name}:{index}"


def split_call_id(call_id: str) -> tuple[str, int] | None:
    """`(name, index)` of a K2 call id, or None when it does not read `functions.NAME:IDX`."""
    match = CALL_ID_PATTERN.fullmatch(call_id)
    if match is None:
        return None
    return match.group("name"), int(match.group("index"))


def call_name(call_id: str) -> str | None:
    """The tool name of a K2 call id (what K2 writes in the header of the call's result), None for another id."""
    parts = split_call_id(call_id)
    return parts[0] if parts else None


def content_text(content: Any) -> str:
    """OpenAI content (None, a string, or a list of parts) as plain text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if part.get("type", "text") == "text")


class Message(BaseModel):
    """One chat message; tool calls only on assistant messages, tool results name their call."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: Role = Field(description="Who speaks.")
    content: str = Field(default="", description="Visible text.")
    reasoning: str | None = Field(default=None, description="Assistant thinking, rendered in <think>.")
    tool_calls: list[ToolCall] = Field(default_factory=list, description="Assistant tool calls.")
    tool_call_id: str | None = Field(default=None, description="For tool messages: the answered call id.")
    name: str | None = Field(
        default=None,
        description="Name shown in the message header instead of the role (K2 writes a tool result's function name "
        "there: `<|im_system|>get_weather<|im_middle|>`); None: the role.",
    )

    @model_validator(mode="after")
    def _check_role_fields(self) -> Message:
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"only assistant messages carry tool_calls, not {self.role!r}")
        if self.reasoning is not None and self.role != "assistant":
            raise ValueError(f"only assistant messages carry reasoning, not {self.role!r}")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        if self.role != "tool" and self.tool_call_id is not None:
            raise ValueError(f"only tool messages carry tool_call_id, not {self.role!r}")
        return self

    @classmethod
    def from_openai(cls, data: dict[str, Any]) -> Message:
        """Accept an OpenAI chat dict (`reasoning_content` or `reasoning` for thinking)."""
        reasoning = data.get("reasoning_content")
        if reasoning is None:
            reasoning = data.get("reasoning")
        calls = [ToolCall.from_openai(call) for call in data.get("tool_calls") or []]
        return cls(
            role=data["role"],
            content=content_text(data.get("content")),
            reasoning=reasoning,
            tool_calls=calls,
            tool_call_id=data.get("tool_call_id"),
            name=data.get("name") or None,
        )

    def to_openai(self) -> dict[str, Any]:
        """OpenAI chat dict; thinking goes to `reasoning_content` (vLLM's name)."""
        data: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.reasoning is not None:
            data["reasoning_content"] = self.reasoning
        if self.tool_calls:
            data["tool_calls"] = [call.to_openai() for call in self.tool_calls]
        if self.tool_call_id is not None:
            data["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            data["name"] = self.name
        return data


def _fill_call_ids(data: dict[str, Any], first_index: int) -> dict[str, Any]:
    """Copy of an OpenAI message dict whose id-less tool calls get K2 ids."""
    calls = []
    for offset, raw_call in enumerate(data.get("tool_calls") or []):
        if not raw_call.get("id"):
            name = raw_call.get("function", raw_call)["name"]
            raw_call = {**raw_call, "id": format_call_id(name, first_index + offset)}
        calls.append(raw_call)
    return {**data, "tool_calls": calls}


def dialogue_from_openai(dialogue: list[dict[str, Any]]) -> list[Message]:
    """Messages from OpenAI dicts; an id-less call gets `functions.NAME:IDX` (IDX dialogue-wide)."""
    messages: list[Message] = []
    call_index = 0
    for data in dialogue:
        messages.append(Message.from_openai(_fill_call_ids(data, call_index)))
        call_index += len(messages[-1].tool_calls)
    return messages
