"""Small SFT datasets in the synth output format, built from the tool_use gym's reference solutions.

Each row is one solved tool_use task: the task's system + user prompt, then per reference turn
an assistant message with the turn's tool calls (K2 ids `functions.NAME:IDX`) and the tool
results the real environment returns when stepped with them, then the reference final answer.
Columns as `k2post synth` writes them: id, messages (JSON), tools (JSON), metadata (JSON),
domain, verdict (JSON).

    rows = tool_use_rows(40)                       # deterministic per seed
    path = write_dataset(rows, tmp_path / "ds")    # datasets.Dataset.save_to_disk
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from k2post.toolsets.checks import Scenario
from k2post.chat.types import Message, ToolCall, ToolSpec, format_call_id
from k2post.envs.base import Task
from k2post.envs.registry import make_environment


def reference_dialogue(env: Any, task: Task) -> list[Message]:
    """Prompt + reference solution of a tool_use task, tool results from really stepping `env`."""
    scenario = Scenario.model_validate(task.answer)
    state, index, messages = env.reset(task), 0, list(task.messages)
    for turn_calls in scenario.reference_turns:
        calls = [
            ToolCall(id=format_call_id(call.name, index + offset), name=call.name, arguments=call.arguments)
            for offset, call in enumerate(turn_calls)
        ]
        assistant = Message(role="assistant", tool_calls=calls)
        messages += [assistant, *env.step(state, assistant).observations]
        index += len(calls)
    messages.append(Message(role="assistant", content=scenario.reference_answer))
    env.step(state, messages[-1])
    return messages


def make_row(
    row_id: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    domain: str = "test",
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One dataset row with JSON text columns."""
    return {
        "id": row_id,
        "messages": json.dumps(messages),
        "tools": json.dumps(tools),
        "metadata": json.dumps(metadata or {}),
        "domain": domain,
        "verdict": json.dumps({"passed": True, "score": 1.0}),
    }


def dialogue_row(task: Task, dialogue: list[Message], tools: list[ToolSpec]) -> dict[str, Any]:
    """The row of a solved task (OpenAI-style messages and tool entries)."""
    metadata = {key: value for key, value in task.metadata.items() if key != "tools"}
    return make_row(
        task.id,
        [m.to_openai() for m in dialogue],
        [t.to_openai() for t in tools],
        domain=str(task.metadata.get("toolset", "tool_use")),
        metadata={**metadata, "task_id": task.id},
    )


def tool_use_rows(
    n: int, seed: int = 0, toolsets: list[str] | None = None, split: str = "train"
) -> list[dict[str, Any]]:
    """`n` rows of solved tool_use tasks (all toolsets unless given)."""
    env = make_environment("tool_use", {"toolsets": toolsets} if toolsets else {})
    rows = []
    for task in env.tasks(split, seed=seed, n=n):
        rows.append(dialogue_row(task, reference_dialogue(env, task), env.tools_for(task)))
    return rows


def write_dataset(rows: list[dict[str, Any]], path: Path) -> Path:
    """Save rows as an HF dataset directory (what the SFT data loader reads)."""
    from datasets import Dataset

    Dataset.from_list(rows).save_to_disk(str(path))
    return path
