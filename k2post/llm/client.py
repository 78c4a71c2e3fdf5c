"""The `LLMClient` protocol: one chat call, messages in, assistant text out.

Anything with `chat(messages, **kw) -> str` is a client (an HTTP client for an OpenAI-compatible
server, an in-process engine, a scripted fake in tests):

    class Echo:
        def chat(self, messages: list[Message], **kw: Any) -> str:
            return messages[-1].content

    isinstance(Echo(), LLMClient)   # True (runtime-checkable)

Clients that can also return the whole assistant turn (tool calls, finish reason, token usage)
implement `ToolLLMClient.chat_result(messages, tools=None, **kw) -> ChatResult`
(`k2post.llm.http_client.HTTPLLMClient` does both).

Components that are rebuilt from plain configs in other processes (reward workers) name a
client factory as `"package.module:callable"`; `load_client_factory` imports it and calls it
with no arguments.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from k2post.chat.types import Message, ToolSpec


@runtime_checkable
class LLMClient(Protocol):
    """Chat with a model: `kw` carries sampling options (temperature, max_tokens, ...)."""

    def chat(self, messages: list[Message], **kw: Any) -> str:
        """The assistant's reply text to `messages`."""
        ...


class LLMClientError(RuntimeError):
    """A chat call failed: transport error after retries, non-200 status, or a malformed reply."""


@dataclass(frozen=True)
class ChatResult:
    """One assistant turn: the parsed message, why generation stopped, and token counts.

    `raw_text` is the text as the model wrote it (special tokens kept when the server allows);
    `parse_errors` lists problems found while reading tool calls out of that text.
    """

    message: Message
    finish_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    raw_text: str = ""
    parse_errors: list[str] = field(default_factory=list)


@runtime_checkable
class ToolLLMClient(LLMClient, Protocol):
    """An `LLMClient` that can also offer tools and return the full turn as a `ChatResult`."""

    def chat_result(self, messages: list[Message], tools: list[ToolSpec] | None = None, **kw: Any) -> ChatResult:
        """The assistant's whole turn (content, tool calls, finish reason, usage)."""
        ...


def load_client_factory(path: str) -> LLMClient:
    """Import `"module:callable"`, call it with no arguments and check the result is a client."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"client factory {path!r} must read 'package.module:callable'")
    factory = getattr(importlib.import_module(module_name), attr)
    client = factory()
    if not isinstance(client, LLMClient):
        raise TypeError(f"client factory {path!r} returned {type(client).__name__}, which has no chat() method")
    return client
