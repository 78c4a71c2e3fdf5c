"""One synthesized multi-turn dialogue: agent <-> tool simulator <-> user simulator.

    trajectory = run_trajectory(agent_prompt, tools, agent, user, tool_sim, max_turns=8)

The loop: system prompt + the user's opening; each assistant turn either calls tools (the tool
simulator answers every call, results go back as `tool` messages) or speaks; after speaking the
user simulator replies or ends the dialogue. A role that raises (an LLM server down, a simulator
bug) ends the trajectory with `error` set — the pipeline records it as a reject, it never stops
the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from k2post.toolsets.base import is_error
from k2post.toolsets.checks import ToolCallRecord
from k2post.chat.types import Message, ToolSpec
from k2post.synth.roles import AgentRole, ToolRole, UserRole


@dataclass
class Trajectory:
    """A finished (or cut) dialogue and what happened in it."""

    messages: list[Message]
    calls: list[ToolCallRecord] = field(default_factory=list)
    turns: int = 0
    finished: bool = False  # the user ended it (not max_turns / an error)
    error: str | None = None

    @property
    def final_answer(self) -> str:
        """Text of the last assistant message without tool calls."""
        for message in reversed(self.messages):
            if message.role == "assistant" and not message.tool_calls:
                return message.content
        return ""


def _run_calls(tool_sim: ToolRole, message: Message, turn: int, traj: Trajectory) -> None:
    for call in message.tool_calls:
        result = tool_sim.call(call.name, dict(call.arguments))
        traj.calls.append(
            ToolCallRecord(
                turn=turn,
                id=call.id,
                name=call.name,
                arguments=dict(call.arguments),
                result=result,
                ok=not is_error(result),
            )
        )
        traj.messages.append(Message(role="tool", tool_call_id=call.id, content=result, name=call.name))


def _step(agent: AgentRole, user: UserRole, tool_sim: ToolRole, tools: list[ToolSpec], traj: Trajectory) -> bool:
    """One assistant turn (+ its tool results or the user's reply). Returns True when over."""
    message = agent.next_turn(list(traj.messages), tools)
    traj.messages.append(message)
    traj.turns += 1
    if message.tool_calls:
        _run_calls(tool_sim, message, traj.turns - 1, traj)
        return False
    reply = user.reply(list(traj.messages))
    if reply is None:
        traj.finished = True
        return True
    traj.messages.append(Message(role="user", content=reply))
    return False


def run_trajectory(
    system_prompt: str, tools: list[ToolSpec], agent: AgentRole, user: UserRole, tool_sim: ToolRole, max_turns: int
) -> Trajectory:
    """Play one dialogue to its end, `max_turns` assistant turns, or a role's error."""
    traj = Trajectory(messages=[Message(role="system", content=system_prompt)])
    try:
        opening = user.opening()
        if not opening.strip():
            raise ValueError("the user simulator wrote an empty opening")
        traj.messages.append(Message(role="user", content=opening))
        while traj.turns < max_turns and not _step(agent, user, tool_sim, tools, traj):
            pass
    except Exception as err:  # a role failing ends this trajectory only
        traj.error = f"{type(err).__name__}: {err}"
    return traj


class _NoReplies:
    """The user of a continued dialogue: says nothing more once the assistant has answered."""

    def opening(self) -> str:
        return ""

    def reply(self, messages: list[Message]) -> str | None:
        return None


def continue_dialogue(
    messages: list[Message], tools: list[ToolSpec], agent: AgentRole, tool_sim: ToolRole, max_turns: int
) -> Trajectory:
    """Continue a given dialogue (ending with a user message) until the assistant answers without tool calls,
    `max_turns` assistant turns, or a role's error."""
    traj = Trajectory(messages=list(messages))
    try:
        while traj.turns < max_turns and not _step(agent, _NoReplies(), tool_sim, tools, traj):
            pass
    except Exception as err:  # a role failing ends this trajectory only
        traj.error = f"{type(err).__name__}: {err}"
    return traj


def openai_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """The dialogue as OpenAI-style dicts (the dataset's `messages` column)."""
    return [message.to_openai() for message in messages]
