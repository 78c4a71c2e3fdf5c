"""Tiny environments for the envs-layer tests (importable by reward workers: module top level).

Robust ones (fuzzed like the built-ins): toy_echo, toy_boxed_sum, toy_counter (multi-turn).
`toy_faulty` misbehaves on purpose, driven by the response text; it is excluded from fuzzing.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

from pydantic import Field

from k2post.chat.types import Message, ToolSpec
from k2post.envs import EnvConfig, Environment, MultiTurnEnvironment, Reward, StepResult, Task, register_environment

WORDS = ["apple", "river", "stone", "cloud", "tiger", "maple", "ember", "quartz"]
FAULTY_ENVS = {"toy_faulty"}


def _user(text: str) -> list[Message]:
    return [Message(role="user", content=text)]


class EchoConfig(EnvConfig):
    upper: bool = Field(False, description="Ask for the word in upper case.")


@register_environment
class ToyEcho(Environment):
    name = "toy_echo"
    task_type = "toy"
    config_cls = EchoConfig

    def tasks(self, split="train", seed=0, n=None) -> Iterator[Task]:
        count = len(WORDS) if n is None else min(n, len(WORDS))
        for i in range(count):
            word = WORDS[(i + seed) % len(WORDS)] + ("" if split == "train" else "-test")
            answer = word.upper() if self.config.upper else word
            yield Task(
                id=f"{split}-{seed}-{i}",
                env=self.name,
                task_type=self.task_type,
                messages=_user(f"Repeat: {word}"),
                answer=answer,
            )

    def score(self, task: Task, response: str) -> Reward:
        response = response if isinstance(response, str) else ""  # model output is hostile: not even text
        exact = float(response.strip() == task.answer)
        contains = float(str(task.answer) in response)
        return Reward(value=0.5 * exact + 0.5 * contains, breakdown={"exact": exact, "contains": contains})


BOXED = re.compile(r"\\boxed\{(-?\d{1,12})\}")


@register_environment
class ToyBoxedSum(Environment):
    name = "toy_boxed_sum"
    task_type = "math"

    def tasks(self, split="train", seed=0, n=None) -> Iterator[Task]:
        offset = 0 if split == "train" else 1000
        for i in range(10 if n is None else n):
            a, b = (seed * 7 + i) % 50 + offset, (seed * 3 + 2 * i) % 50
            yield Task(
                id=f"{split}-{seed}-{i}",
                env=self.name,
                task_type=self.task_type,
                messages=_user(f"What is {a} + {b}?"),
                answer=a + b,
            )

    def score(self, task: Task, response: str) -> Reward:
        found = BOXED.findall(response if isinstance(response, str) else "")
        if not found:
            return Reward(value=0.0, info={"extracted": None})
        return Reward(value=float(int(found[-1]) == task.answer), info={"extracted": found[-1]})


@register_environment
class ToyCounter(MultiTurnEnvironment):
    """Reach the target total by calling add(n); any other reply ends the episode."""

    name = "toy_counter"
    task_type = "tool"
    reward_range = (-1.0, 1.0)
    max_turns = 4

    def tools(self) -> list[ToolSpec]:
        schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
        return [ToolSpec(name="add", description="Add n to the total.", parameters=schema)]

    def tasks(self, split="train", seed=0, n=None) -> Iterator[Task]:
        for i in range(5 if n is None else n):
            target = 3 + i + seed + (100 if split == "test" else 0)
            yield Task(
                id=f"{split}-{seed}-{i}",
                env=self.name,
                task_type=self.task_type,
                messages=_user(f"Reach {target}."),
                answer=target,
            )

    def reset(self, task: Task) -> dict[str, Any]:
        return {"total": 0, "turns": 0}

    def step(self, state: dict[str, Any], assistant: Message) -> StepResult:
        state["turns"] += 1
        observations = []
        for call in assistant.tool_calls:
            n = call.arguments.get("n")
            ok = call.name == "add" and isinstance(n, int) and not isinstance(n, bool) and abs(n) < 10**6
            state["total"] += n if ok else 0
            text = f"total={state['total']}" if ok else "error: call add with an integer n"
            observations.append(Message(role="tool", content=text, tool_call_id=call.id))
        done = not assistant.tool_calls or state["turns"] >= self.max_turns
        return StepResult(observations=observations, done=done)

    def score_state(self, task: Task, state: dict[str, Any]) -> Reward:
        hit = state["total"] == task.answer
        return Reward(value=1.0 if hit else -1.0, breakdown={"hit": float(hit)}, info={"total": state["total"]})


class FaultyConfig(EnvConfig):
    setup_delay_s: float = Field(0.0, description="Sleep this long when the environment is built.")


@register_environment
class ToyFaulty(Environment):
    """Misbehaves as the response says: raise, hang, exit, exit_once:<marker> (exit unless the marker file exists,
    creating it), sysexit, nan, notreward (a str), unpicklable,
    child:<pidfile> (start a sleeping child, write its pid, hang), value:<float> (that reward, in range or not),
    float:<float> (that plain float, as verl / TRL reward functions return); anything else scores 1."""

    name = "toy_faulty"
    task_type = "toy"
    config_cls = FaultyConfig

    def __init__(self, config=None) -> None:
        super().__init__(config)
        time.sleep(self.config.setup_delay_s)

    def tasks(self, split="train", seed=0, n=None) -> Iterator[Task]:
        for i in range(3 if n is None else n):
            yield Task(id=f"{split}-{i}", env=self.name, task_type=self.task_type, messages=_user("Misbehave."))

    def score(self, task: Task, response: str) -> Reward:
        if response == "raise":
            raise ValueError("bad response")
        if response == "hang":
            time.sleep(3600)
        if response == "exit":
            os._exit(3)
        if response.startswith("exit_once:"):  # the worker dies the first time (a marker file remembers it)
            marker = response[len("exit_once:") :]
            if not os.path.exists(marker):
                open(marker, "w").close()
                os._exit(3)
        if response == "sysexit":
            sys.exit(1)
        if response == "nan":
            return Reward(value=math.nan)
        if response == "notreward":
            return "1.0"  # type: ignore[return-value]
        if response == "unpicklable":
            return Reward(value=1.0, info={"fn": lambda: None})
        if response.startswith("value:"):
            return Reward(value=float(response[len("value:") :]))
        if response.startswith("float:"):
            return float(response[len("float:") :])  # type: ignore[return-value]
        if response.startswith("child:"):
            child = subprocess.Popen(["sleep", "300"])
            with open(response[len("child:") :], "w") as handle:
                handle.write(str(child.pid))
            time.sleep(3600)
        return Reward(value=1.0)
