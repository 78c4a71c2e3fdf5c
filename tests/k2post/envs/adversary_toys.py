"""Tiny gyms for the adversarial-suite tests (k2post/envs/adversary.py): one honest, and some that pay a cheap
strategy on purpose. Not registered on import (the other envs-layer tests iterate the registry); the CLI tests load
them by `file.py:Class` reference, as a third-party gym would be."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from k2post.chat.types import Message, ToolCall, ToolSpec
from k2post.envs import Environment, HonestPair, MultiTurnEnvironment, Reward, StepResult, Task

WORDS = ["apple", "river", "stone", "cloud", "tiger", "maple", "ember", "quartz"]


def _task(env: Environment, split: str, i: int, prompt: str, answer: Any) -> Task:
    messages = [Message(role="user", content=prompt)]
    return Task(id=f"{split}-{i}", env=env.name, task_type="toy", messages=messages, answer=answer)


class ToyExact(Environment):
    """Repeat a word exactly: 1 for the word alone, else 0. Nothing cheap pays."""

    name = "adv_toy_exact"
    task_type = "toy"

    def tasks(self, split="train", seed=0, n=None) -> Iterator[Task]:
        if split not in ("train", "test"):
            raise ValueError(f"{self.name}: split {split!r} is not supported by this environment")
        for i in range(len(WORDS) if n is None else min(n, len(WORDS))):
            word = WORDS[(i + seed) % len(WORDS)] + ("" if split == "train" else str(i))
            yield _task(self, split, i, f"Repeat: {word}", word)

    def score(self, task: Task, response: str) -> Reward:
        text = response if isinstance(response, str) else ""
        return Reward(value=float(text.strip() == task.answer))

    def honest(self, task: Task) -> HonestPair | None:
        return HonestPair(right=task.answer, wrong=task.answer[::-1] + "x")


class ToyTrainOnly(ToyExact):
    """ToyExact without a test split (the CLI falls back to train)."""

    name = "adv_toy_train_only"

    def tasks(self, split="train", seed=0, n=None) -> Iterator[Task]:
        if split != "train":
            raise ValueError(f"{self.name}: split {split!r} is not supported by this environment (use one of: train)")
        yield from super().tasks(split, seed, n)


class ToyEmptyPays(ToyExact):
    """A bug a policy would find: an empty reply counts as a perfect one."""

    name = "adv_toy_empty_pays"

    def score(self, task: Task, response: str) -> Reward:
        text = response if isinstance(response, str) else ""
        return Reward(value=1.0) if not text.strip() else super().score(task, text)


class ToyFragile(ToyExact):
    """Parses a reply that looks like JSON and lets the parser's errors out (a forced scorer error)."""

    name = "adv_toy_fragile"

    def score(self, task: Task, response: str) -> Reward:
        if response.startswith(("[", "{")):
            json.loads(response)
        return super().score(task, response)


class ToyMarkup(ToyExact):
    """Its errors and hack names carry rich-markup-like text (model output often does): shown as text."""

    name = "adv_toy_markup"

    def score(self, task: Task, response: str) -> Reward:
        if not response:
            raise ValueError("closing tag [/red] and [bold]x[/bold] in the reply")
        return super().score(task, response)

    def hacks(self, task: Task) -> dict[str, str]:
        return {"[/b]tag": "x"}


class ToyOwnHack(ToyExact):
    """Pays a reply that shouts the word: only the env's own `hacks` tries that."""

    name = "adv_toy_own_hack"

    def score(self, task: Task, response: str) -> Reward:
        text = response if isinstance(response, str) else ""
        return Reward(value=0.5) if text == task.answer.upper() + "!" else super().score(task, text)

    def hacks(self, task: Task) -> dict[str, str]:
        return {"shout": task.answer.upper() + "!"}


class ToyNoHonest(ToyExact):
    """Gives no honest answers: the suite cannot judge it."""

    name = "adv_toy_no_honest"

    def honest(self, task: Task) -> HonestPair | None:
        return None


class ToyLookup(MultiTurnEnvironment):
    """Read a value with read(key) and report it. Bug: a reply without any call counts as "nothing went wrong"
    and scores 0.6, more than an honest read with a wrongly reported value (0.5)."""

    name = "adv_toy_lookup"
    task_type = "tool"
    max_turns = 4

    def tools(self) -> list[ToolSpec]:
        schema = {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}
        return [ToolSpec(name="read", description="Read the value stored under key.", parameters=schema)]

    def tasks(self, split="train", seed=0, n=None) -> Iterator[Task]:
        for i in range(4 if n is None else min(n, 4)):
            yield _task(self, split, i, f"What value is stored under k{i}?", {"key": f"k{i}", "value": 40 + i})

    def reset(self, task: Task) -> dict[str, Any]:
        return {"store": {task.answer["key"]: task.answer["value"]}, "read": False, "final": None, "turns": 0}

    def step(self, state: dict[str, Any], assistant: Message) -> StepResult:
        state["turns"] += 1
        observations = []
        for call in assistant.tool_calls:
            value = state["store"].get(call.arguments.get("key")) if call.name == "read" else None
            state["read"] |= value is not None
            observations.append(Message(role="tool", content=str(value), tool_call_id=call.id))
        if not assistant.tool_calls:
            state["final"] = assistant.content
        return StepResult(observations=observations, done=not assistant.tool_calls or state["turns"] >= 4)

    def score_state(self, task: Task, state: dict[str, Any]) -> Reward:
        if not state["read"]:
            return Reward(value=0.6)
        return Reward(value=1.0 if str(task.answer["value"]) == (state["final"] or "").strip() else 0.5)

    def honest(self, task: Task) -> HonestPair | None:
        call = ToolCall(id="functions.read:0", name="read", arguments={"key": task.answer["key"]})
        read = Message(role="assistant", content="", tool_calls=[call])
        value = task.answer["value"]
        return HonestPair(
            right=[read, Message(role="assistant", content=str(value))],
            wrong=[read, Message(role="assistant", content=str(value + 1))],
        )


class ToyPick(Environment):
    """Pick the longer of two words, as [[A]] or [[B]] (a pairwise judge in miniature); a blind guess scores 0.5.
    The gold is balanced across tasks; the "longer" cue agrees with it on 3 of 4 tasks (a surface cue)."""

    name = "adv_toy_pick"
    task_type = "toy"
    chance_reward = 0.5
    PAIRS = [("kiwi", "banana", "B"), ("cherry", "fig", "A"), ("plum", "apricot", "B"), ("lemon", "quince", "A")]

    def tasks(self, split="train", seed=0, n=None) -> Iterator[Task]:
        for i in range(64 if n is None else n):  # the 4 pairs over and over (the suite scores a choice gym on 64)
            a, b, gold = self.PAIRS[i % len(self.PAIRS)]
            yield _task(self, split, i, f"Which is the better fruit for a pie? A: {a} B: {b}", gold)

    def score(self, task: Task, response: str) -> Reward:
        verdicts = re.findall(r"\[\[([AB])\]\]", response if isinstance(response, str) else "")
        return Reward(value=float(len(verdicts) == 1 and verdicts[0] == task.answer))

    def honest(self, task: Task) -> HonestPair | None:
        other = "B" if task.answer == "A" else "A"
        return HonestPair(right=f"It is {task.answer}. [[{task.answer}]]", wrong=f"It is {other}. [[{other}]]")

    def hacks(self, task: Task) -> dict[str, str]:
        a, b, _ = self.PAIRS[int(task.id.rsplit("-", 1)[1]) % len(self.PAIRS)]
        return {"always_a": "[[A]]", "longer": "[[A]]" if len(a) >= len(b) else "[[B]]"}


class ToyPickNoChance(ToyPick):
    """ToyPick without its chance level: held to honest-wrong (0), guessing fails it."""

    name = "adv_toy_pick_no_chance"
    chance_reward = None
