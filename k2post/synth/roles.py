"""The roles of a synthesized dialogue, each with a deterministic built-in and an LLM backend.

- agent (writes assistant turns): `ReferenceAgent` plays the task's reference solution, with a
  seeded `mistake_rate` of realistic failures (a skipped call, a wrong argument, an early or wrong
  answer) that the judge must catch — rejection sampling needs rejects — or, for a seeded
  `direct_answer_rate` of tasks, answers at once without the tools; `LLMAgent` asks any
  `ToolLLMClient` (a vLLM server over HTTP, the policy's engine in process).
- user simulator: `RuleUser` phrases the request by persona and nudges an assistant that stops to
  ask; `LLMUser` has an LLM play the persona.
- tool simulator: `RuleToolSimulator` runs the domain's stateful simulator (controlled randomness
  through the state's seeded failure rate); `LLMToolSimulator` has an LLM answer calls (K2's world
  model), with every earlier call and result in its prompt so its answers stay consistent, arguments
  checked against the inputSchema and answers against the outputSchema.
"""

from __future__ import annotations

import json
import random
from typing import Any, Protocol

from k2post.toolsets.base import Toolset, ToolsetState
from k2post.toolsets.schema import check_arguments, check_value
from k2post.chat.types import Message, ToolCall, ToolSpec, dump_json, format_call_id
from k2post.chat.untrusted import block, escape_untrusted
from k2post.llm.client import LLMClient, ToolLLMClient
from k2post.synth.tasks import PERSONAS, SynthTask

MISTAKES = ("skip_call", "wrong_argument", "early_answer", "wrong_answer")


class AgentRole(Protocol):
    def next_turn(self, messages: list[Message], tools: list[ToolSpec]) -> Message: ...


class UserRole(Protocol):
    def opening(self) -> str: ...

    def reply(self, messages: list[Message]) -> str | None: ...


class ToolRole(Protocol):
    def call(self, name: str, arguments: dict[str, Any]) -> str: ...


def _calls_so_far(messages: list[Message]) -> int:
    return sum(len(m.tool_calls) for m in messages)


def _perturb(arguments: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """One argument changed: a number shifted, or a string altered."""
    if not arguments:
        return arguments
    key = rng.choice(sorted(arguments))
    value = arguments[key]
    if isinstance(value, bool):
        changed: Any = not value
    elif isinstance(value, (int, float)):
        changed = value + rng.choice([1, 2, 5]) * (1 if rng.random() < 0.5 else -1)
    else:
        changed = f"{value}x" if isinstance(value, str) else value
    return {**arguments, key: changed}


def _last_results(messages: list[Message]) -> list[Message]:
    """The tool results since the last assistant message."""
    results: list[Message] = []
    for message in reversed(messages):
        if message.role != "tool":
            break
        results.insert(0, message)
    return results


def reference_reasoning(calls: list[tuple[str, dict[str, Any]]], messages: list[Message], answer: bool) -> str:
    """The built-in agent's thinking before a turn: what the last results said, then what it does next and why."""
    seen = "; ".join(f"{m.tool_call_id} returned {m.content[:80]}" for m in _last_results(messages))
    lines = [f"So far: {seen}."] if seen else []
    if answer:
        lines.append("I have what I need from the tools; now I answer the user." if seen else "I can answer directly.")
    else:
        planned = ", ".join(f"{name}({json.dumps(args, sort_keys=True)})" for name, args in calls)
        lines.append(f"Next I call {planned}, since the request needs {'these' if len(calls) > 1 else 'this'} first.")
    return " ".join(lines)


class ReferenceAgent:
    """Plays the reference solution turn by turn; maybe with one seeded mistake; with `reasoning`, each turn thinks
    first (`reference_reasoning`) as K2 Thinking's think -> act -> think trajectories do."""

    def __init__(
        self,
        task: SynthTask,
        rng: random.Random,
        mistake_rate: float,
        mistake: str | None = None,
        direct: bool = False,
        reasoning: bool = False,
    ):
        """`mistake` forces one kind (tests); otherwise one is drawn with probability `mistake_rate`.
        `direct`: answer at once with the reference answer, calling no tool."""
        self.reasoning = reasoning
        if mistake is not None and mistake not in MISTAKES:
            raise ValueError(f"unknown mistake {mistake!r}; known: {MISTAKES}")
        self.direct = direct
        self.turns = (
            [] if direct else [[(c.name, dict(c.arguments)) for c in turn] for turn in task.scenario.reference_turns]
        )
        self.answer = task.scenario.reference_answer
        drawn = rng.choice(MISTAKES) if rng.random() < mistake_rate else None
        self.mistake = mistake or drawn
        self.rng = rng
        self._apply_mistake()
        self.position = 0

    def _apply_mistake(self) -> None:
        calls = [(t, c) for t, turn in enumerate(self.turns) for c in range(len(turn))]
        if self.mistake == "skip_call" and calls:
            t, c = self.rng.choice(calls)
            del self.turns[t][c]
            self.turns = [turn for turn in self.turns if turn]
        elif self.mistake == "wrong_argument" and any(self.turns[t][c][1] for t, c in calls):
            t, c = self.rng.choice([(t, c) for t, c in calls if self.turns[t][c][1]])
            name, args = self.turns[t][c]
            self.turns[t][c] = (name, _perturb(args, self.rng))
        elif self.mistake == "early_answer" and self.turns:
            self.turns = self.turns[:-1]
        elif self.mistake == "wrong_answer":
            self.answer = "All done."
        else:
            self.mistake = None  # nothing to apply it to (no calls / no arguments)

    def next_turn(self, messages: list[Message], tools: list[ToolSpec]) -> Message:
        if self.position >= len(self.turns):
            thought = reference_reasoning([], messages, answer=True) if self.reasoning else None
            return Message(role="assistant", content=self.answer, reasoning=thought)
        planned = self.turns[self.position]
        first = _calls_so_far(messages)
        calls = [ToolCall(id=format_call_id(n, first + i), name=n, arguments=a) for i, (n, a) in enumerate(planned)]
        self.position += 1
        thought = reference_reasoning(planned, messages, answer=False) if self.reasoning else None
        return Message(role="assistant", tool_calls=calls, reasoning=thought)


class LLMAgent:
    """Assistant turns from an LLM (tool calls parsed by the client); call ids renumbered K2-style; the model's
    reasoning is kept when `keep_reasoning` (dropped otherwise)."""

    def __init__(self, client: ToolLLMClient, keep_reasoning: bool = False, **sampling: Any):
        self.client, self.sampling, self.keep_reasoning = client, sampling, keep_reasoning
        self.parse_errors: list[str] = []

    def next_turn(self, messages: list[Message], tools: list[ToolSpec]) -> Message:
        result = self.client.chat_result(messages, tools=tools, **self.sampling)
        self.parse_errors += result.parse_errors
        first = _calls_so_far(messages)
        calls = [
            c.model_copy(update={"id": format_call_id(c.name, first + i)})
            for i, c in enumerate(result.message.tool_calls)
        ]
        reasoning = result.message.reasoning if self.keep_reasoning else None
        return result.message.model_copy(update={"tool_calls": calls, "reasoning": reasoning})


class RuleUser:
    """Persona-phrased request; nudges (at most `max_nudges` times) when the assistant asks."""

    def __init__(self, task: SynthTask, max_nudges: int = 1):
        self.persona, self.request, self.nudges_left = PERSONAS[task.persona], task.scenario.prompt, max_nudges

    def opening(self) -> str:
        return self.persona.opening.format(request=self.request)

    def reply(self, messages: list[Message]) -> str | None:
        last = messages[-1].content.strip() if messages else ""
        if last.endswith("?") and self.nudges_left > 0:
            self.nudges_left -= 1
            return self.persona.nudge
        return None


class LLMUser:
    """An LLM plays the user: writes the opening from the goal, then replies or says DONE."""

    def __init__(self, client: LLMClient, task: SynthTask, max_replies: int = 1, **sampling: Any):
        persona = PERSONAS[task.persona]
        self.system = (
            f"You play a user talking to an assistant. Persona: {persona.name} (your first message looks like "
            f"{persona.opening!r}). Your goal:\n{block('goal', task.scenario.prompt)}\nWrite only the user's next "
            "message."
        )
        self.client, self.sampling, self.replies_left = client, sampling, max_replies

    def opening(self) -> str:
        return self.client.chat(
            [Message(role="system", content=self.system), Message(role="user", content="Write your first message.")],
            **self.sampling,
        ).strip()

    def reply(self, messages: list[Message]) -> str | None:
        if self.replies_left <= 0:
            return None
        self.replies_left -= 1
        prompt = user_reply_prompt(messages)
        text = self.client.chat(
            [Message(role="system", content=self.system), Message(role="user", content=prompt)], **self.sampling
        ).strip()
        return None if not text or text.upper().startswith("DONE") else text


def user_reply_prompt(messages: list[Message]) -> str:
    """The simulated user's prompt: the conversation so far (one JSON-quoted line per message, in an escaped
    block), then the instruction."""
    shown = "\n".join(
        f"{m.role}: {json.dumps(m.content, ensure_ascii=False)}"
        for m in messages
        if m.role in ("user", "assistant") and m.content
    )
    return (
        f"The conversation so far:\n{block('conversation', shown)}\n"
        "If your goal is met, answer exactly DONE; else write your reply."
    )


class RuleToolSimulator:
    """The domain's stateful rule-based simulator."""

    def __init__(self, toolset: Toolset, state: ToolsetState, failure_rate: float = 0.0):
        self.toolset, self.state = toolset, state
        if failure_rate > 0:
            self.state.failure_rate = failure_rate

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        return self.toolset.call(self.state, name, arguments)


class LLMToolSimulator:
    """An LLM answers tool calls (K2's world model): arguments are checked against the inputSchema first,
    the spec, the tool's outputSchema and every earlier call/result are in its prompt, and an answer
    that is not valid against the outputSchema is asked for once more, then becomes an `Error:` result."""

    def __init__(
        self,
        client: LLMClient,
        tools: list[ToolSpec],
        context: str,
        output_schemas: dict[str, dict[str, Any]] | None = None,
        **sampling: Any,
    ):
        self.client, self.sampling = client, sampling
        self.specs = {tool.name: tool for tool in tools}
        self.output_schemas = output_schemas or {}
        self.context, self.history = context, []
        self.invalid_outputs = 0

    def _prompt(self, name: str, arguments: dict[str, Any], problem: str | None) -> str:
        """The world model's prompt: spec, world, earlier calls (results JSON-quoted) and the call, each in an
        escaped block (spec text, results and model-written arguments are untrusted)."""
        earlier = "\n".join(f"{n}({dump_json(a)}) -> {dump_json(r)}" for n, a, r in self.history) or "(none)"
        schema = self.output_schemas.get(name)
        shape = f"Reply with JSON valid against this output schema: {dump_json(schema)}" if schema else ""
        retry = f"\nYour previous reply was rejected ({problem}); answer again." if problem else ""
        return (
            f"You simulate the tool {dump_json(name)}.\n{block('tool_spec', dump_json(self.specs[name].to_openai()))}\n"
            f"{block('world', self.context)}\nEarlier calls and results (stay consistent with them):\n"
            f"{block('earlier_calls', earlier)}\n{block('call', f'{name}({dump_json(arguments)})')}\n"
            f"Reply with the tool's result only. {escape_untrusted(shape)}{escape_untrusted(retry)}"
        )

    def _output_problem(self, name: str, text: str) -> str | None:
        """Why `text` is not a valid answer of `name` (its outputSchema), or None."""
        schema = self.output_schemas.get(name)
        if not text:
            return "empty result"
        if schema is None:
            return None
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            return "not JSON"
        return check_value("result", value, schema)

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        if name not in self.specs:
            return f"Error: unknown tool {name!r} (available: {', '.join(self.specs)})"
        problem = check_arguments(self.specs[name].parameters, arguments)
        if problem is not None:
            return f"Error: {name}: {problem}"
        problem = None
        for _ in range(2):
            text = self.client.chat(
                [Message(role="user", content=self._prompt(name, arguments, problem))], **self.sampling
            )
            text = text.strip()
            problem = self._output_problem(name, text)
            if problem is None:
                break
        if problem is not None:
            self.invalid_outputs += 1
            text = f"Error: {name}: the simulated result was invalid ({problem})"
        self.history.append((name, arguments, text))
        return text
