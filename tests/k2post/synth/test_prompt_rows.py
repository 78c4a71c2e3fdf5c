"""Synthesis over a user's own chat dataset (`prompt_datasets:`): rows read like SFT's (TRL/OpenAI `messages`
lists, JSONL), cut after the last user message, continued by the agent, judged against the rubric and the
row's own answer; unusable rows reported by file and row. The real LLM roles: tests/k2post/synth/test_llm_backend.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from k2post.chat.types import Message, ToolCall, ToolSpec
from k2post.synth.config import PromptDatasetConfig, SynthConfig
from k2post.synth.judge import LLMJudge
from k2post.synth.prompt_rows import prompt_row, prompt_tasks

WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}
ROWS: list[Any] = [
    {"messages": [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4"}]},
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_x1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_x1", "content": "fog"},
            {"role": "assistant", "content": "Foggy."},
            {"role": "user", "content": [{"type": "text", "text": "And in Lima?"}]},
        ],
        "tools": [WEATHER_TOOL],
    },  # fmt: skip
    {"messages": [{"role": "assistant", "content": "Hello"}]},
    {"messages": [{"role": "wizard", "content": "abracadabra"}]},
]


@pytest.fixture
def chats(tmp_path: Path) -> Path:
    path = tmp_path / "chats.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in ROWS) + "\nnot json\n")
    return path


def test_rows_are_cut_after_the_last_user_message_and_bad_rows_named(chats: Path) -> None:
    tasks, problems = prompt_tasks(PromptDatasetConfig(path=str(chats)))
    assert [t.label for t in tasks] == ["chats", "chats"] and len({t.id for t in tasks}) == 2
    first, second = tasks
    assert [m.role for m in first.messages] == ["user"] and first.reference == "4"
    assert [m.role for m in second.messages] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert second.messages[2].tool_calls[0].id == "functions.get_weather:0"  # OpenAI ids renumbered
    assert second.messages[3].tool_call_id == "functions.get_weather:0"
    assert second.messages[-1].content == "And in Lima?" and second.reference == ""
    assert [t.name for t in second.tools] == ["get_weather"]
    assert len(problems) == 3
    assert "no user message to answer" in problems[0] and f"{chats}: row row-" in problems[0]
    assert "messages[0]" in problems[1] and problems[2] == f"{chats}:5: invalid JSON (Expecting value, column 1)"


class ScriptedAgent:
    def __init__(self, turns: list[Message]):
        self.turns = list(turns)

    def next_turn(self, messages: list[Message], tools: list[ToolSpec]) -> Message:
        return self.turns.pop(0)


class ScriptedClient:
    def __init__(self, reply: str):
        self.reply, self.prompts = reply, []

    def chat(self, messages: list[Message], **sampling: Any) -> str:
        self.prompts.append(messages[-1].content)
        return self.reply


class EchoTool:
    def call(self, name: str, arguments: dict[str, Any]) -> str:
        return f"{name} says sunny"


def test_a_prompt_is_continued_judged_and_written_as_a_row(chats: Path) -> None:
    task = prompt_tasks(PromptDatasetConfig(path=str(chats), label="mine", rubric="Be right."))[0][1]
    call = ToolCall(id="functions.get_weather:1", name="get_weather", arguments={"city": "Lima"})
    agent = ScriptedAgent([Message(role="assistant", tool_calls=[call]), Message(role="assistant", content="Sunny.")])
    client = ScriptedClient('{"accept": true, "reasons": []}')
    row = prompt_row(task, agent, EchoTool(), LLMJudge(client), max_turns=4)
    assert row["id"] == f"mine/{task.id}" and row["domain"] == "mine" and row["accepted"]
    assert [m["role"] for m in row["messages"]][-3:] == ["assistant", "tool", "assistant"]
    assert row["messages"][-2]["content"] == "get_weather says sunny"
    assert row["metadata"]["tool_calls"] == 1 and "Be right." in client.prompts[0]
    looping = ScriptedAgent([Message(role="assistant", tool_calls=[call])] * 2)
    stuck = prompt_row(task, looping, EchoTool(), LLMJudge(client), max_turns=2)
    assert not stuck["accepted"] and stuck["verdict"]["reasons"] == ["unfinished"] and len(client.prompts) == 1


def test_prompt_datasets_config_errors(chats: Path) -> None:
    entry = {"path": str(chats)}
    with pytest.raises(ValidationError, match="prompt_datasets need agent: llm"):
        SynthConfig(domains=[], prompt_datasets=[entry])
    llm = {"agent": "llm", "judge": "llm", "llm": {"base_url": "http://127.0.0.1:1/v1"}}
    with pytest.raises(ValidationError, match="distinct labels"):
        SynthConfig(domains=[], prompt_datasets=[entry, entry], **llm)
    with pytest.raises(ValidationError, match="path: give the dataset"):
        SynthConfig(domains=[], prompt_datasets=[{}], **llm)
    assert SynthConfig(domains=[], prompt_datasets=[entry], **llm).prompt_datasets[0].key == "chats"


def test_an_unreachable_llm_endpoint_is_one_line_before_any_task(chats: Path, tmp_path: Path) -> None:
    """The endpoint is checked once before the run (no attempt on every prompt, no "0 accepted" at the end)."""
    from k2post.synth.pipeline import SynthError, run_synth

    llm = {"base_url": "http://127.0.0.1:9/v1", "max_retries": 0, "timeout_s": 2.0}
    cfg = SynthConfig(
        domains=[],
        prompt_datasets=[{"path": str(chats)}],
        agent="llm",
        judge="llm",
        llm=llm,
        out_dir=str(tmp_path / "out"),
    )
    with pytest.raises(SynthError, match=r"llm endpoint http://127.0.0.1:9/v1 does not answer .*k2post serve"):
        run_synth(cfg)
    shards = list((tmp_path / "out" / "shards").glob("*.jsonl"))
    assert all(not shard.read_text().strip() for shard in shards)  # no task was attempted
