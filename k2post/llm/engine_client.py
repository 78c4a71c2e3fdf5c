"""An in-process `LLMClient` over a `RolloutEngine`: the policy's own engine as critic, judge or
simulator, with no server in between.

    client = EngineLLMClient(engine, SamplingConfig(temperature=0, max_tokens=128))
    text = client.chat([Message(role="user", content="Rank these answers ...")])
    turn = client.chat_result(messages, tools=[spec])        # ChatResult with parsed tool calls
    texts = client.chat_batch([messages_1, messages_2])       # one batched engine call (critic comparisons)

Keyword arguments of `chat` / `chat_result` override the sampling config per call
(`temperature=`, `max_tokens=`, `top_p=`, `seed=`, `stop=`).
"""

from __future__ import annotations

from typing import Any

from k2post.chat.types import Message, ToolSpec
from k2post.llm.client import ChatResult, LLMClientError
from k2post.rollout.config import SamplingConfig
from k2post.rollout.engine import RolloutEngine, decode_turn


class EngineLLMClient:
    """`LLMClient` / `ToolLLMClient` backed by an in-process engine."""

    def __init__(self, engine: RolloutEngine, sampling: SamplingConfig | None = None):
        self.engine = engine
        self.sampling = sampling or SamplingConfig(temperature=0.0, max_tokens=256)

    def _sampling(self, overrides: dict[str, Any]) -> SamplingConfig:
        unknown = sorted(set(overrides) - set(SamplingConfig.model_fields))
        if unknown:
            raise LLMClientError(f"unknown sampling options {unknown}; known: {sorted(SamplingConfig.model_fields)}")
        return SamplingConfig.model_validate({**self.sampling.model_dump(), **overrides, "n": 1})

    def chat_result(self, messages: list[Message], tools: list[ToolSpec] | None = None, **kw: Any) -> ChatResult:
        """The whole assistant turn: parsed message, finish reason, token counts, raw text."""
        return self.chat_results([messages], tools, **kw)[0]

    def chat_results(
        self, dialogues: list[list[Message]], tools: list[ToolSpec] | None = None, **kw: Any
    ) -> list[ChatResult]:
        """One whole assistant turn per dialogue, generated in one batched engine call (a critic's comparisons)."""
        turns = self.engine.chat([list(messages) for messages in dialogues], self._sampling(kw), tools)
        return [self._result(turn) for turn in turns]

    def _result(self, turn: Any) -> ChatResult:
        generation = turn.generation
        usage = {"prompt_tokens": len(generation.prompt_ids), "completion_tokens": len(generation.token_ids)}
        return ChatResult(
            message=turn.message,
            finish_reason=generation.finish_reason,
            usage=usage,
            raw_text=decode_turn(self.engine.tokenizer, generation.token_ids),
            parse_errors=[error.message for error in turn.parse_errors],
        )

    def chat(self, messages: list[Message], tools: list[ToolSpec] | None = None, **kw: Any) -> str:
        """The assistant's reply text."""
        return self.chat_result(messages, tools, **kw).message.content

    def chat_batch(self, dialogues: list[list[Message]], **kw: Any) -> list[str]:
        """The reply text of each dialogue, in one batched engine call."""
        return [result.message.content for result in self.chat_results(dialogues, **kw)]
