"""The `RolloutEngine` seam: what the RL loop, the critic and the agentic rollouts need from a
generation backend. The real backend is `k2post.rollout.vllm_engine.VLLMEngine` (vLLM in-process);
another backend only has to provide these methods.

    outs = engine.generate([[2, 17, 3]], SamplingConfig(temperature=0, max_tokens=16))  # [prompts][n]
    turns = engine.chat([[Message(role="user", content="hi")]], sampling, tools=[...])   # parsed turns
    engine.sleep(); ...; engine.wake_up()           # give memory back while the trainer runs
    with engine.weight_update():                    # one consistent update (bucket by bucket)
        engine.load_weights([(hf_name, tensor), ...])

Engines work on token ids; the K2 chat template (`k2post.chat`) turns dialogues into ids and
`chat_turns` parses what came back, so tool calls are read the same way for every backend.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from k2post.chat.parse import ToolCallParseError, parse_assistant
from k2post.chat.template import chat_format, render_ids
from k2post.chat.tokens import EOS, IM_END
from k2post.chat.types import Message, ToolSpec
from k2post.rollout.config import SamplingConfig
from k2post.rollout.sleep import SleepStats


class EngineAsleepError(RuntimeError):
    """The engine was asked to generate or load weights while asleep: call wake_up() first."""


@dataclass
class Generation:
    """One sampled response: its token ids, their log-probs under the engine, and text."""

    prompt_ids: list[int]
    token_ids: list[int]
    # [len(token_ids)]: each sampled token's log-prob under the distribution it was drawn from (logits / T, then
    # top-p renormalised; greedy: T = 1), the RL behaviour policy mu
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None  # "stop" | "length" | None
    routed_experts: Any = None  # record_routing: int16 [prompt + response tokens, moe_layers, top_k], -1 = none


@dataclass
class ChatTurn:
    """One assistant turn produced by `chat`: the parsed message (well-formed tool calls only),
    the raw generation it came from, and the problems the parser found."""

    message: Message
    generation: Generation
    parse_errors: list[ToolCallParseError] = field(default_factory=list)


@runtime_checkable
class RolloutEngine(Protocol):
    """A policy generation backend (vLLM in-process is the real one)."""

    weights_version: int

    @property
    def tokenizer(self): ...

    def generate(
        self, prompts_ids: list[list[int]], sampling: SamplingConfig | Sequence[SamplingConfig]
    ) -> list[list[Generation]]: ...

    def chat(
        self, dialogues: list[list[Message]], sampling: SamplingConfig, tools: Sequence[ToolSpec] | None = None
    ) -> list[ChatTurn]: ...

    def load_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> int: ...

    def weight_update(self) -> contextlib.AbstractContextManager[None]: ...

    def sleep(self, level: int = 1) -> SleepStats: ...

    def wake_up(self) -> SleepStats: ...


def turn_stop_ids(tokenizer) -> list[int]:
    """Token ids that end an assistant turn: `<|im_end|>` and `<|endoftext|>`."""
    ids = [tokenizer.convert_tokens_to_ids(token) for token in (IM_END, EOS)]
    return sorted({i for i in ids if isinstance(i, int) and i >= 0})


def with_turn_stops(sampling: SamplingConfig, tokenizer) -> SamplingConfig:
    """`sampling` with the turn-ending token ids added to its stop ids."""
    stops = sorted(set(sampling.stop_token_ids) | set(turn_stop_ids(tokenizer)))
    return sampling.model_copy(update={"stop_token_ids": stops})


def decode_turn(tokenizer, token_ids: list[int]) -> str:
    """Generated ids as text with special tokens kept (the parser needs the tool-call tokens)."""
    return tokenizer.decode(token_ids, skip_special_tokens=False)


def parse_generation(tokenizer, generation: Generation, start_index: int = 0, known_tools=None) -> ChatTurn:
    """Parse a generated assistant turn (tool calls numbered from `start_index`; in the thinking format the turn
    starts inside the prompt's `<think>`)."""
    parsed = parse_assistant(
        decode_turn(tokenizer, generation.token_ids),
        start_index=start_index,
        known_tools=known_tools,
        thinking=chat_format(tokenizer) == "thinking",
    )
    return ChatTurn(message=parsed.to_message(), generation=generation, parse_errors=list(parsed.errors))


def _call_count(dialogue: Sequence[Message]) -> int:
    return sum(len(message.tool_calls) for message in dialogue)


def chat_turns(
    engine: RolloutEngine,
    dialogues: list[list[Message]],
    sampling: SamplingConfig,
    tools: Sequence[ToolSpec] | None = None,
) -> list[ChatTurn]:
    """Render each dialogue with the K2 template, generate one turn each, parse the tool calls."""
    tokenizer = engine.tokenizer
    if sampling.n != 1:
        raise ValueError(f"chat generates one turn per dialogue: sampling.n must be 1, got {sampling.n}")
    prompts = [
        render_ids(tokenizer, dialogue, tools=tools, add_generation_prompt=True).input_ids for dialogue in dialogues
    ]
    outs = engine.generate(prompts, with_turn_stops(sampling, tokenizer))
    known = [tool.name for tool in tools] if tools else None
    return [
        parse_generation(tokenizer, out[0], start_index=_call_count(dialogue), known_tools=known)
        for dialogue, out in zip(dialogues, outs)
    ]
