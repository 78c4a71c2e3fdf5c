"""The `LLMClient` protocol: one chat call, messages in, assistant text out.

Anything with `chat(messages, **kw) -> str` is a client (an HTTP client for an OpenAI-compatible
server, an in-process engine, a scripted fake in tests):

    class Echo:
        def chat(self, messages: list[Message], **kw: Any) -> str:
            return messages[-1].content

    isinstance(Echo(), LLMClient)   # True (runtime-checkable)

Components that are rebuilt from plain configs in other processes (reward workers) name a
client factory as `"package.module:callable"`; `load_client_factory` imports it and calls it
with no arguments.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol, runtime_checkable

from k2post.chat.types import Message


@runtime_checkable
class LLMClient(Protocol):
    """Chat with a model: `kw` carries sampling options (temperature, max_tokens, ...)."""

    def chat(self, messages: list[Message], **kw: Any) -> str:
        """The assistant's reply text to `messages`."""
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
