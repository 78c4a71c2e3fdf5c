"""Synthesis over your own prompts (`prompt_datasets:`): rejection sampling on a chat dataset.

Each row of an OpenAI/TRL conversational dataset (read by `k2post.sft.sources.open_dataset`, the same reader
and column mapping as SFT; call ids renumbered to K2's form) is cut after its last user message; the LLM
agent continues it (tool calls, if the row declares `tools`, are answered by the LLM world model,
`LLMToolSimulator`), and the LLM judge keeps or rejects the result against the entry's `rubric` — with the
row's own final answer, when it has one, shown as a reference. Rows go to the same shards and dataset as
every other synthesized row (`domain` = the entry's label, id `LABEL/ROW_ID`).

    tasks, problems = prompt_tasks(entry)          # problems: `file: row ID: why` for unusable rows
    row = prompt_row(task, agent, tool_sim, judge, max_turns)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from k2post.chat.types import Message, ToolSpec
from k2post.synth.config import PromptDatasetConfig
from k2post.synth.judge import LLMJudge, TrajectoryVerdict
from k2post.synth.roles import AgentRole, ToolRole
from k2post.synth.trajectory import continue_dialogue, openai_messages


@dataclass(frozen=True)
class PromptTask:
    """One row of a prompt dataset, ready to continue."""

    id: str
    label: str
    source: str
    messages: list[Message]
    tools: list[ToolSpec]
    reference: str
    rubric: str


def _cut(dialogue: list[Message]) -> tuple[list[Message], str] | None:
    """(the dialogue up to its last user message, the assistant's final text after it), or None without a user
    message."""
    last_user = max((i for i, m in enumerate(dialogue) if m.role == "user"), default=None)
    if last_user is None:
        return None
    after = [m.content for m in dialogue[last_user + 1 :] if m.role == "assistant" and not m.tool_calls]
    return dialogue[: last_user + 1], (after[-1] if after else "")


def prompt_tasks(entry: PromptDatasetConfig) -> tuple[list[PromptTask], list[str]]:
    """The entry's usable rows as tasks, and one line per unusable row. SFTDataError when the dataset as a
    whole cannot be read (the message names the path)."""
    from k2post.sft.data import RowError, row_dialogue
    from k2post.sft.sources import PROBLEM_KEY, open_dataset

    tasks, problems = [], []
    for row in open_dataset(entry.path, entry.limit, entry.columns):
        if PROBLEM_KEY in row:
            problems.append(row[PROBLEM_KEY])
            continue
        try:
            dialogue, tools = row_dialogue(row, "renumber")
        except RowError as err:
            problems.append(f"{entry.path}: row {row['id']}: {err}")
            continue
        cut = _cut(dialogue)
        if cut is None:
            problems.append(f"{entry.path}: row {row['id']}: no user message to answer")
            continue
        prefix, reference = cut
        tasks.append(PromptTask(str(row["id"]), entry.key, entry.path, prefix, tools, reference, entry.rubric))
    return tasks, problems


def prompt_row_id(task: PromptTask) -> str:
    """A prompt row's id: the entry's label and the row's id."""
    return f"{task.label}/{task.id}"


def prompt_row(
    task: PromptTask, agent: AgentRole, tool_sim: ToolRole, judge: LLMJudge, max_turns: int
) -> dict[str, Any]:
    """Continue one prompt with the agent and judge it: a shard row (accepted or not)."""
    trajectory = continue_dialogue(task.messages, task.tools, agent, tool_sim, max_turns)
    rubric = [task.rubric] + ([f"a reference answer (for comparison): {task.reference}"] if task.reference else [])
    if trajectory.finished or trajectory.error:
        verdict = judge.judge_lines(rubric, trajectory)
    else:  # still calling tools after max_turns
        verdict = TrajectoryVerdict(accepted=False, reasons=["unfinished"], judge="llm")
    metadata = {
        "task_id": task.id,
        "domain": task.label,
        "source": task.source,
        "attempt": 0,
        "agent": "llm",
        "turns": trajectory.turns,
        "tool_calls": len(trajectory.calls),
        "tool_errors": sum(not c.ok for c in trajectory.calls),
    }
    return {
        "id": prompt_row_id(task),
        "domain": task.label,
        "attempt": 0,
        "accepted": verdict.accepted,
        "messages": openai_messages(trajectory.messages),
        "tools": [t.to_openai() for t in task.tools],
        "metadata": metadata,
        "verdict": {**verdict.model_dump(), "error": trajectory.error},
    }
