"""Synthesis from any MCP tool spec: config, the run end to end, specs the project did not write
(tests/k2post/toolsets/data/mcp_specs, see SOURCES.md there), the LLM world-model simulator's checks,
and the same domain as an RL environment."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from datasets import load_from_disk
from pydantic import ValidationError

from k2post.chat.template import render_text
from k2post.chat.types import Message, ToolSpec, dialogue_from_openai
from k2post.synth.config import SynthConfig
from k2post.synth.domains import spec_domain
from k2post.synth.pipeline import run_synth
from k2post.synth.roles import LLMToolSimulator
from k2post.synth.specs import load_tool_specs
from k2post.toolsets.base import is_error
from k2post.toolsets.schema_values import sample_value
from k2post.toolsets.spec_templates import decoded

THIRD_PARTY = Path(__file__).resolve().parents[1] / "toolsets" / "data" / "mcp_specs"
THIRD_PARTY_FILES = sorted(THIRD_PARTY.glob("*.json"))
WEATHER = {
    "tools": [
        {
            "name": "get_weather",
            "description": "Current weather of a city.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
            },
        }
    ]
}


@pytest.fixture
def weather_file(tmp_path: Path) -> Path:
    path = tmp_path / "specs" / "weather.json"
    path.parent.mkdir()
    path.write_text(json.dumps(WEATHER))
    return path


def test_a_spec_file_is_a_domain_and_the_old_key_says_its_new_name(weather_file: Path) -> None:
    cfg = SynthConfig(tool_specs=[str(weather_file)], domains=["weather", "bank"])
    assert set(cfg.build_domains()) == {"weather", "bank"}
    with pytest.raises(ValidationError, match=r"unknown domains \['weather'\].*tool spec file"):
        SynthConfig(domains=["weather"])
    with pytest.raises(ValidationError, match=r"`tool_specs_dir` is now `tool_specs"):
        SynthConfig.model_validate({"tool_specs_dir": str(weather_file.parent), "domains": ["weather"]})
    assert set(SynthConfig(tool_specs=[str(weather_file.parent)], domains=["weather"]).build_domains()) == {"weather"}


def test_synthesis_from_a_users_spec_end_to_end(tmp_path: Path, weather_file: Path) -> None:
    out = tmp_path / "out"
    cfg = SynthConfig(
        out_dir=str(out), tool_specs=[str(weather_file)], domains=["weather"], tasks_per_domain=6,
        heldout_tasks_per_domain=2, mistake_rate=0.3, seed=3,
    )  # fmt: skip
    stats = run_synth(cfg)
    rows = [dict(r) for r in load_from_disk(str(out / "dataset"))]
    assert stats["accepted"] == len(rows) > 0 and {r["domain"] for r in rows} == {"weather"}
    for row in rows:
        tools = [ToolSpec.from_openai(t) for t in json.loads(row["tools"])]
        assert [t.name for t in tools] == ["get_weather"]
        dialogue = dialogue_from_openai(json.loads(row["messages"]))
        assert any(m.tool_calls for m in dialogue) and render_text(dialogue, tools)
    assert json.loads((out / "tool_specs" / "weather.json").read_text())["tools"][0]["name"] == "get_weather"


@pytest.mark.parametrize("path", THIRD_PARTY_FILES, ids=[p.stem for p in THIRD_PARTY_FILES])
def test_third_party_specs_simulate_validly_and_give_tasks(path: Path) -> None:
    (spec,) = load_tool_specs(path)
    domain = spec_domain(spec)
    raw = {tool["name"]: tool for tool in json.loads(path.read_text())["tools"]}
    state = domain.toolset.new_state(toolset=spec.domain, seed=0)
    for tool in spec.tools:
        for seed in range(3):
            arguments = sample_value(tool.parameters, random.Random(seed))
            jsonschema.validate(arguments, raw[tool.name]["inputSchema"])  # the original schema, $refs and all
            result = domain.toolset.call(state, tool.name, arguments)
            if not is_error(result) and "outputSchema" in raw[tool.name]:
                jsonschema.validate(decoded(result), raw[tool.name]["outputSchema"])
            assert not is_error(result) or ": no " in result, result  # only "no such record" domain errors
    assert len(domain.templates) >= len(spec.tools) // 2, sorted(domain.templates)


@pytest.mark.parametrize("path", THIRD_PARTY_FILES, ids=[p.stem for p in THIRD_PARTY_FILES])
def test_third_party_spec_domains_are_rl_environments(path: Path) -> None:
    from k2post_environments.tool_use import ToolUseConfig, ToolUseEnv

    domain = load_tool_specs(path)[0].domain
    env = ToolUseEnv(ToolUseConfig(toolsets=[domain], tool_specs=[str(path)]))
    for task in env.tasks("train", seed=0, n=6):
        state = env.reset(task)
        for turn in task.answer["reference_turns"]:
            calls = [{"type": "function", "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
                     for c in turn]  # fmt: skip
            env.step(state, {"role": "assistant", "content": "", "tool_calls": calls})
        env.step(state, Message(role="assistant", content=task.answer["reference_answer"]))
        assert env.score_state(task, state).value == pytest.approx(1.0), (task.id, state.calls)


class ScriptedWorldModel:
    """An LLMClient that replies with prepared texts in order (the simulator's checks are under test)."""

    def __init__(self, replies: list[str]):
        self.replies, self.prompts = list(replies), []

    def chat(self, messages: list[Message], **sampling: Any) -> str:
        self.prompts.append(messages[-1].content)
        return self.replies.pop(0)


def test_llm_world_model_checks_arguments_and_output_schema() -> None:
    tool = ToolSpec(name="get_weather", parameters=WEATHER["tools"][0]["inputSchema"])
    output = {"type": "object", "properties": {"temp": {"type": "number"}}, "required": ["temp"]}
    client = ScriptedWorldModel(["sunny", '{"temp": 21.5}', "still wrong", "nope"])
    sim = LLMToolSimulator(client, [tool], "a weather service", {"get_weather": output})
    assert sim.call("get_weather", {"city": "Oslo"}) == "Error: get_weather: missing required argument 'unit'"
    assert client.prompts == []  # bad arguments never reach the LLM
    assert sim.call("get_weather", {"city": "Oslo", "unit": "celsius"}) == '{"temp": 21.5}'
    assert "output schema" in client.prompts[0] and "rejected (not JSON)" in client.prompts[1]
    assert sim.call("get_weather", {"city": "Lima", "unit": "celsius"}).startswith(
        "Error: get_weather: the simulated result was invalid (not JSON)"
    )
    assert sim.invalid_outputs == 1 and 'get_weather({"city": "Oslo"' in client.prompts[-1]
