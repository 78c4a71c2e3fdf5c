"""`HTTPLLMClient`: chat with an OpenAI-compatible server (vLLM's `api_server`, `k2post serve`).

    client = HTTPLLMClient(HTTPClientConfig(base_url="http://127.0.0.1:8000/v1", api_key="k"))
    text = client.chat([Message(role="user", content="hi")], temperature=0, max_tokens=8)
    turn = client.chat_result(messages, tools=[ToolSpec(name="get_weather")])
    turn.message.tool_calls, turn.finish_reason, turn.usage

`chat` returns the reply text (the `LLMClient` protocol); `chat_result` returns the whole turn.
Tool calls come from the response's `tool_calls` when the server parsed them; otherwise the raw
text is read with `k2post.chat.parse.parse_assistant` (the request asks the server to keep
special tokens, `skip_special_tokens: false`, so K2 tool-call tokens survive).

Untrusted text: the server renders the messages into one text and re-tokenizes it, so every string of the messages
and tools is sent through `defuse_special_tokens` (`<|im_end|>` -> `< |im_end|>`): text in a message never becomes a
turn on the server. `complete_text` sends its prompt as given (the caller writes the structure).

Connection errors, timeouts, 429 and 5xx are retried with exponential backoff
(`backoff_s * 2**attempt`, capped at `backoff_max_s`); other 4xx fail at once. Every failure
is one `LLMClientError` line: what was called, the status and an excerpt of the body.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
from pydantic import Field

from k2post.chat.parse import parse_assistant
from k2post.chat.tokens import THINK_BEGIN, THINK_END, defuse_special_tokens
from k2post.chat.types import Message, ToolCall, ToolSpec
from k2post.config.base import K2Config
from k2post.llm.client import ChatResult, LLMClientError

BODY_EXCERPT_CHARS = 300
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class HTTPClientConfig(K2Config):
    """Where the OpenAI-compatible server is and how hard to try."""

    base_url: str = Field("http://127.0.0.1:8000/v1", description="Server URL including the `/v1` prefix.")
    api_key: str | None = Field(None, description="Bearer token (the server's --api-key); null for none.")
    model: str = Field("", description="Served model name; empty asks the server (`/v1/models`, first entry).")
    timeout_s: float = Field(60.0, gt=0, description="Per-request timeout (connect, read, write) in seconds.")
    max_retries: int = Field(
        3, ge=0, description="Retries after the first attempt on connection errors, timeouts, 429, 5xx."
    )
    backoff_s: float = Field(0.5, ge=0, description="First retry delay in seconds; doubles each retry.")
    backoff_max_s: float = Field(8.0, ge=0, description="Upper bound of one retry delay in seconds.")
    keep_special_tokens: bool = Field(
        True, description="Send `skip_special_tokens: false` so K2 tool-call and <think> tokens reach the parser."
    )


def _excerpt(text: str) -> str:
    """One-line excerpt of a response body for error messages."""
    flat = " ".join(text.split())
    return flat if len(flat) <= BODY_EXCERPT_CHARS else flat[:BODY_EXCERPT_CHARS] + "..."


def backoff_delay(cfg: HTTPClientConfig, attempt: int) -> float:
    """Delay before retry number `attempt` (0-based): `backoff_s * 2**attempt`, capped."""
    return min(cfg.backoff_s * (2**attempt), cfg.backoff_max_s)


def defused(value: Any) -> Any:
    """`value` (a JSON value) with every string passed through `defuse_special_tokens`: the server renders the
    messages with its chat template and re-tokenizes the text, so a special-token string in a message would become
    a real turn there."""
    if isinstance(value, str):
        return defuse_special_tokens(value)
    if isinstance(value, list):
        return [defused(item) for item in value]
    if isinstance(value, dict):
        return {key: defused(item) for key, item in value.items()}
    return value


def _usage(data: dict[str, Any]) -> dict[str, int]:
    """Integer token counts from an OpenAI `usage` object (missing -> empty)."""
    usage = data.get("usage") or {}
    return {key: int(value) for key, value in usage.items() if isinstance(value, int)}


def _first_choice(data: Any, what: str) -> dict[str, Any]:
    """`choices[0]` of a completion response, or `LLMClientError` naming what is missing."""
    if not isinstance(data, dict):
        raise LLMClientError(f"{what}: response is not a JSON object: {_excerpt(json.dumps(data))}")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise LLMClientError(f"{what}: response has no choices: {_excerpt(json.dumps(data))}")
    return choices[0]


def opens_inside_reasoning(text: str) -> bool:
    """Whether a reply began inside its reasoning: a thinking-format server's prompt ends with `<think>`, so its
    text reads `reasoning</think>answer` (a `</think>` with no `<think>` before it)."""
    end = text.find(THINK_END)
    return end >= 0 and THINK_BEGIN not in text[:end]


def message_from_choice(choice: dict[str, Any]) -> tuple[Message, str, list[str]]:
    """`(message, raw_text, parse_errors)` of a chat choice; text tool calls go to the K2 parser."""
    raw = choice.get("message")
    if not isinstance(raw, dict):
        raise LLMClientError(f"chat completion: choice has no message: {_excerpt(json.dumps(choice))}")
    text = raw.get("content") or ""
    if not isinstance(text, str):
        raise LLMClientError(f"chat completion: message content is not text: {_excerpt(json.dumps(raw))}")
    reasoning = raw.get("reasoning_content") or raw.get("reasoning")
    if raw.get("tool_calls"):
        try:
            calls = [ToolCall.from_openai(call) for call in raw["tool_calls"]]
        except (KeyError, TypeError, ValueError) as err:
            raise LLMClientError(f"chat completion: bad tool_calls: {err}") from err
        return Message(role="assistant", content=text, reasoning=reasoning, tool_calls=calls), text, []
    parsed = parse_assistant(text, thinking=opens_inside_reasoning(text))
    message = parsed.to_message()
    if reasoning and message.reasoning is None:
        message = message.model_copy(update={"reasoning": reasoning})
    return message, text, [error.message for error in parsed.errors]


class HTTPLLMClient:
    """httpx client for `/v1/chat/completions` and `/v1/completions` with retries."""

    def __init__(
        self,
        cfg: HTTPClientConfig | None = None,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.cfg = cfg or HTTPClientConfig()
        headers = {"Authorization": f"Bearer {self.cfg.api_key}"} if self.cfg.api_key else {}
        self._http = httpx.Client(
            base_url=self.cfg.base_url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(self.cfg.timeout_s),
            transport=transport,
        )
        self._sleep = sleep
        self._model = self.cfg.model

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> HTTPLLMClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send_once(self, method: str, path: str, body: dict[str, Any] | None) -> httpx.Response | str:
        """One attempt: the response, or a string describing a retryable transport failure."""
        try:
            return self._http.request(method, path, json=body)
        except httpx.TimeoutException as err:
            return f"timed out after {self.cfg.timeout_s:g}s ({type(err).__name__})"
        except httpx.TransportError as err:
            return f"connection failed ({type(err).__name__}: {err})"

    def request_json(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """Send with retries and return the decoded JSON body, or raise `LLMClientError`."""
        what = f"{method} {self.cfg.base_url.rstrip('/')}{path}"
        for attempt in range(self.cfg.max_retries + 1):
            result = self._send_once(method, path, body)
            retryable = isinstance(result, str) or result.status_code in RETRY_STATUSES
            if not retryable:
                break
            if attempt < self.cfg.max_retries:
                self._sleep(backoff_delay(self.cfg, attempt))
        tries = f"after {attempt + 1} attempt(s)"
        if isinstance(result, str):
            raise LLMClientError(f"{what}: {result} {tries}")
        if result.status_code != 200:
            raise LLMClientError(f"{what}: HTTP {result.status_code} {tries}: {_excerpt(result.text)}")
        try:
            return result.json()
        except ValueError as err:
            raise LLMClientError(f"{what}: response is not JSON ({err}): {_excerpt(result.text)}") from err

    def models(self) -> list[str]:
        """Ids of the models the server serves (`GET /models`)."""
        data = self.request_json("GET", "/models")
        try:
            return [str(entry["id"]) for entry in data["data"]]
        except (KeyError, TypeError) as err:
            raise LLMClientError(f"GET /models: unexpected body: {_excerpt(json.dumps(data))}") from err

    @property
    def model(self) -> str:
        """The configured model name, else the server's first model (asked once)."""
        if not self._model:
            names = self.models()
            if not names:
                raise LLMClientError("GET /models: the server lists no model")
            self._model = names[0]
        return self._model

    def _extra(self) -> dict[str, Any]:
        """vLLM extra sampling fields sent with every request."""
        return {"skip_special_tokens": False} if self.cfg.keep_special_tokens else {}

    def chat_result(self, messages: list[Message], tools: list[ToolSpec] | None = None, **sampling: Any) -> ChatResult:
        """The assistant's whole turn for `messages`; `sampling` goes into the request body."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": defused([message.to_openai() for message in messages]),
            **self._extra(),
            **sampling,
        }
        if tools:
            body["tools"] = defused([tool.to_openai() for tool in tools])
        data = self.request_json("POST", "/chat/completions", body)
        choice = _first_choice(data, "chat completion")
        message, raw_text, errors = message_from_choice(choice)
        return ChatResult(message, choice.get("finish_reason"), _usage(data), raw_text, errors)

    def chat(self, messages: list[Message], tools: list[ToolSpec] | None = None, **sampling: Any) -> str:
        """The assistant's reply text (the `LLMClient` protocol)."""
        return self.chat_result(messages, tools=tools, **sampling).message.content

    def complete_text(self, prompt: str, **sampling: Any) -> tuple[str, str | None]:
        """`(text, finish_reason)` of a raw-text completion (`/completions`, no chat template)."""
        body = {"model": self.model, "prompt": prompt, **self._extra(), **sampling}
        choice = _first_choice(self.request_json("POST", "/completions", body), "completion")
        text = choice.get("text")
        if not isinstance(text, str):
            raise LLMClientError(f"completion: choice has no text: {_excerpt(json.dumps(choice))}")
        return text, choice.get("finish_reason")


def endpoint_problem(client: Any, base_url: str) -> str | None:
    """One tiny chat call before a long run; None when the endpoint answers, else one line saying what to fix (an
    endpoint that is down, refuses the key or serves no such model would otherwise fail every item of the run)."""
    try:
        client.chat([Message(role="user", content="Reply with OK.")], temperature=0.0, max_tokens=1)
    except Exception as err:  # noqa: BLE001 (LLMClientError, a bad reply: the endpoint cannot serve this run)
        reason = " ".join(str(err).split())
        reason = reason if len(reason) <= 200 else reason[:199] + "…"
        return (
            f"llm endpoint {base_url} does not answer ({reason}): start it (e.g. `k2post serve`) "
            "or fix llm.base_url / llm.model / llm.api_key"
        )
    return None
