"""Rollouts of a K2-Thinking-format model: the generation prompt ends with `<think>`, so the model's first tokens are
reasoning (counted against the reasoning budget) and the parser reads the turn as starting inside that block."""

from __future__ import annotations

import copy

import pytest

from k2post.chat.template import CHAT_TEMPLATES, GENERATION_PROMPTS
from k2post.chat.tokens import IM_END, THINK_BEGIN, THINK_END
from k2post.chat.types import Message
from k2post.envs.base import Environment, Reward, Task
from k2post.rollout.agentic import AgenticRollout, EpisodeOptions
from k2post.rollout.config import AgenticRolloutConfig, SamplingConfig
from k2post.rollout.engine import Generation, parse_generation

TASK = Task(id="t0", env="echo", task_type="echo", messages=[Message(role="user", content="Say hi")])


class _EchoEnv(Environment):
    """Single-turn: any answer scores 0."""

    name = "echo"

    def tasks(self, split="train", seed=0, n=None):
        yield TASK

    def score(self, task, response):
        return Reward(value=0.0)


class _ScriptedEngine:
    """Answers every prompt with the same token ids (written with `text`), and records the prompts."""

    weights_version = 0

    def __init__(self, tokenizer, text: str):
        self.tokenizer, self.prompts = tokenizer, []
        self.ids = tokenizer(text, add_special_tokens=False).input_ids

    def generate(self, prompts, samplings):
        self.prompts += prompts
        return [[Generation(list(p), list(self.ids), [-0.1] * len(self.ids), finish_reason="stop")] for p in prompts]


@pytest.fixture(scope="module")
def tokenizers(tiny_qwen2_dir):
    from k2post.models.loading import load_tokenizer

    instruct = load_tokenizer(tiny_qwen2_dir)
    thinking = copy.deepcopy(instruct)
    thinking.chat_template = CHAT_TEMPLATES["thinking"]
    return {"instruct": instruct, "thinking": thinking}


@pytest.mark.parametrize(("fmt", "reasoning", "counted"), [("thinking", "ok so", 2), ("instruct", None, 0)])
def test_prompt_think_opens_the_reasoning(tokenizers, fmt: str, reasoning: str | None, counted: int) -> None:
    tokenizer = tokenizers[fmt]
    written = f"ok so{THINK_END}hi{IM_END}" if fmt == "thinking" else f"hi{IM_END}"
    engine = _ScriptedEngine(tokenizer, written)
    runner = AgenticRollout(engine, {"echo": _EchoEnv()}, AgenticRolloutConfig(), SamplingConfig(temperature=0.0))
    episode = runner.start("echo", TASK, options=EpisodeOptions(max_reasoning_tokens=100))
    assert episode.in_think == (fmt == "thinking")
    assert tokenizer.decode(engine.prompts[0] if engine.prompts else episode.token_ids).endswith(
        GENERATION_PROMPTS[fmt]
    )
    runner.run_iteration([episode])
    assert episode.finish_reason == "env_done" and episode.reasoning_tokens == counted
    assert episode.messages[-1] == Message(role="assistant", content="hi", reasoning=reasoning)
    assert not episode.in_think


def test_parse_generation_reads_a_thinking_turn_without_its_think(tokenizers) -> None:
    tokenizer = tokenizers["thinking"]
    text = 'look up<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{"a": 1}'
    ids = tokenizer(text + "<|tool_call_end|><|tool_calls_section_end|>" + IM_END, add_special_tokens=False).input_ids
    turn = parse_generation(tokenizer, Generation([], ids))
    assert turn.message.reasoning == "look up" and [c.name for c in turn.message.tool_calls] == ["f"]
    assert [e.kind for e in turn.parse_errors] == ["unterminated_think"]
    assert THINK_BEGIN not in tokenizer.decode(ids)
