"""The synthesis run end to end with the built-in roles: dataset, stats, resume, held-out tasks, CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import load_from_disk

from k2post.chat.template import render_ids
from k2post.chat.types import ToolSpec, dialogue_from_openai
from k2post.config.registry import load_run_config
from k2post.synth.config import SynthConfig
from k2post.synth.pipeline import read_heldout, read_shards, run_synth

ROOT = Path(__file__).resolve().parents[3]


def _cfg(out: Path, **kw) -> SynthConfig:
    base = {
        "out_dir": str(out),
        "domains": ["bank", "inventory"],
        "tasks_per_domain": 8,
        "heldout_tasks_per_domain": 3,
        "mistake_rate": 0.4,
        "seed": 5,
    }
    return SynthConfig(**{**base, **kw})


def _rows(path: Path) -> list[dict]:
    return [dict(r) for r in load_from_disk(str(path))]


def test_run_writes_dataset_rejects_stats_and_specs(tmp_path, tiny_qwen2_dir):
    from k2post.models.loading import load_tokenizer

    stats = run_synth(_cfg(tmp_path / "out"))
    out = tmp_path / "out"
    accepted, rejected = _rows(out / "dataset"), _rows(out / "rejected")
    assert stats["tasks"] == 16 and stats["accepted"] == len(accepted) and stats["rejected"] == len(rejected) > 0
    assert stats["per_domain"].keys() == {"bank", "inventory"} and sum(stats["rejected_by_reason"].values()) >= len(
        rejected
    )
    assert json.loads((out / "stats.json").read_text()) == stats
    assert sorted(p.name for p in (out / "tool_specs").iterdir()) == ["bank.json", "inventory.json"]
    tokenizer = load_tokenizer(tiny_qwen2_dir)
    for row in accepted:
        assert set(row) == {"id", "messages", "tools", "metadata", "verdict", "domain"}
        messages = dialogue_from_openai(json.loads(row["messages"]))
        tools = [ToolSpec.from_openai(t) for t in json.loads(row["tools"])]
        rendered = render_ids(tokenizer, messages, tools=tools)  # the SFT contract: it renders
        assert sum(rendered.assistant_mask) > 0 and json.loads(row["verdict"])["accepted"]
        assert messages[-1].role == "assistant" and not messages[-1].tool_calls
    assert all(not json.loads(r["verdict"])["accepted"] and json.loads(r["verdict"])["reasons"] for r in rejected)


def test_resume_after_a_crash_gives_the_same_dataset(tmp_path):
    whole = tmp_path / "whole"
    run_synth(_cfg(whole))
    cut = tmp_path / "cut"
    run_synth(_cfg(cut))
    shard = next((cut / "shards").glob("part-*.jsonl"))
    lines = shard.read_text().splitlines(keepends=True)
    shard.write_text("".join(lines[: len(lines) // 2]) + lines[len(lines) // 2][:40])  # a crash mid-line
    from k2post_pipelines.synth import main

    assert main(["--resume", str(cut)]) == 0  # the one resume spelling: the run's own config.yaml
    stats = json.loads((cut / "stats.json").read_text())
    assert _rows(cut / "dataset") == _rows(whole / "dataset")
    assert stats == json.loads((whole / "stats.json").read_text())
    assert len(list((cut / "shards").glob("part-*.jsonl"))) == 2  # the rerun appended a new shard
    assert len(read_shards(cut / "shards")) == len(read_shards(whole / "shards"))


def test_heldout_tasks_are_test_split_and_never_synthesized(tmp_path):
    run_synth(_cfg(tmp_path / "out"))
    heldout = read_heldout(tmp_path / "out" / "heldout_tasks.jsonl")
    assert len(heldout) == 6 and {t.split for t in heldout} == {"test"}
    prompts = {json.loads(r["messages"])[1]["content"] for r in _rows(tmp_path / "out" / "dataset")}
    assert not any(t.scenario.prompt in p for t in heldout for p in prompts)


def test_yaml_config_loads_and_bad_fields_are_one_line_errors(tmp_path):
    cfg = load_run_config(ROOT / "configs" / "synth_tool_use.yaml", [f"out_dir={tmp_path}"])
    assert isinstance(cfg, SynthConfig) and cfg.out_dir == str(tmp_path)
    cases = [
        (["domains=[bank,weather]"], "unknown domains ['weather']"),
        (["agent=llm"], "agent use the LLM: add an `llm:` section"),
        (["personas=[grumpy]"], "unknown personas ['grumpy']"),
    ]
    for overrides, message in cases:
        with pytest.raises(Exception, match=message.replace("[", r"\[").replace("]", r"\]")):
            load_run_config(ROOT / "configs" / "synth_tool_use.yaml", overrides)


def test_cli_runs_and_reports(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "k2post.cli",
            "synth",
            str(ROOT / "configs" / "synth_tool_use.yaml"),
            f"out_dir={tmp_path / 'o'}",
            "tasks_per_domain=3",
            "heldout_tasks_per_domain=1",
            "domains=[recipes]",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "tasks kept" in proc.stdout and (tmp_path / "o" / "dataset").is_dir()
    bad = subprocess.run(
        [sys.executable, "-m", "k2post.cli", "synth", str(ROOT / "configs" / "synth_tool_use.yaml"), "domains=[nope]"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        bad.returncode == 2 and "unknown domains ['nope']" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    )


def test_templates_focus_the_synthesis(tmp_path):
    stats = run_synth(_cfg(tmp_path / "out", domains=["inventory"], templates=["inventory_look_up"]))
    metadata = [json.loads(r["metadata"]) for r in _rows(tmp_path / "out" / "dataset")]
    assert stats["tasks"] == 8 and {m["template"] for m in metadata} == {"inventory_look_up"}
    assert {t.scenario.template for t in read_heldout(tmp_path / "out" / "heldout_tasks.jsonl")} == {
        "inventory_look_up"
    }
    with pytest.raises(ValueError, match=r"templates \['bank_nope'\] are not templates"):
        _cfg(tmp_path, templates=["bank_nope"])
    with pytest.raises(ValueError, match=r"domains \['bank'\] have none of the listed templates"):
        _cfg(tmp_path, templates=["inventory_look_up"])


def test_direct_answer_rate_writes_that_share_of_tool_free_answers(tmp_path):
    cfg = _cfg(
        tmp_path / "out",
        domains=["calculator"],
        templates=["calc_multiply", "calc_sum"],
        tasks_per_domain=60,
        heldout_tasks_per_domain=0,
        mistake_rate=0.0,
        direct_answer_rate=0.5,
    )
    stats = run_synth(cfg)
    rows = _rows(tmp_path / "out" / "dataset")
    direct = [r for r in rows if json.loads(r["metadata"])["direct"]]
    assert stats["direct_accepted"] == len(direct) and 18 <= len(direct) <= 42 and len(rows) == 60
    for row in rows:
        called = any(m.get("tool_calls") for m in json.loads(row["messages"]))
        assert called != json.loads(row["metadata"])["direct"]
    again = run_synth(cfg.model_copy(update={"out_dir": str(tmp_path / "again")}))
    assert again["direct_accepted"] == stats["direct_accepted"]  # seeded per task


def test_direct_answers_only_on_the_listed_templates(tmp_path):
    cfg = _cfg(
        tmp_path / "out",
        domains=["calculator"],
        templates=["calc_multiply", "calc_sum"],
        tasks_per_domain=40,
        heldout_tasks_per_domain=0,
        mistake_rate=0.0,
        direct_answer_rate=1.0,
        direct_answer_templates=["calc_multiply"],
    )
    run_synth(cfg)
    rows = [json.loads(r["metadata"]) for r in _rows(tmp_path / "out" / "dataset")]
    assert {m["template"] for m in rows if m["direct"]} == {"calc_multiply"}
    assert all(m["direct"] for m in rows if m["template"] == "calc_multiply")


def test_direct_answer_templates_must_be_synthesized(tmp_path):
    from k2post.config.loader import ConfigError, validate_config

    with pytest.raises(ConfigError, match=r"direct_answer_templates \['calc_wide'\] are not synthesized templates"):
        validate_config(
            SynthConfig,
            {
                "domains": ["calculator"],
                "templates": ["calc_sum"],
                "direct_answer_rate": 0.5,
                "direct_answer_templates": ["calc_wide"],
            },
            "synth.yaml",
        )


def test_an_environment_listed_twice_needs_a_label_and_keeps_both_entries(tmp_path):
    from k2post.config.loader import ConfigError, validate_config

    one = {"env": "math", "config": {"difficulty": 1}, "tasks": 12}
    two = {"env": "math", "config": {"difficulty": 2}, "tasks": 8, "seed_offset": 2000}
    with pytest.raises(ConfigError, match=r"gym_tasks must name each entry once, got \['math', 'math'\]"):
        validate_config(SynthConfig, {"domains": [], "gym_tasks": [one, two]}, "synth.yaml")
    cfg = SynthConfig(
        out_dir=str(tmp_path / "out"), domains=[], gym_tasks=[one, {**two, "label": "math_d2"}], mistake_rate=0.0
    )
    stats = run_synth(cfg)
    ids = [r["id"] for r in _rows(tmp_path / "out" / "dataset")]
    assert stats["tasks"] == 20 and len(ids) == 20
    assert sum(i.startswith("math/") for i in ids) == 12 and sum(i.startswith("math_d2/") for i in ids) == 8


def test_reasoning_trajectories_think_before_every_turn_and_train_in_sft(tmp_path, tiny_qwen2_dir):
    from k2post.models.loading import load_tokenizer
    from k2post.sft.config import SFTDataConfig
    from k2post.sft.data import load_sft_data

    run_synth(
        _cfg(tmp_path / "out", domains=["calculator"], mistake_rate=0.0, heldout_tasks_per_domain=0, reasoning=True)
    )
    rows = _rows(tmp_path / "out" / "dataset")
    assert rows
    for row in rows:
        messages = dialogue_from_openai(json.loads(row["messages"]))
        for index, message in enumerate(m for m in messages if m.role == "assistant"):
            assert message.reasoning, f"{row['id']}: assistant turn {index} has no reasoning"
            for call in message.tool_calls:
                assert call.name in message.reasoning  # it says what it calls ...
        after_tool = [m for prev, m in zip(messages, messages[1:]) if prev.role == "tool" and m.role == "assistant"]
        assert all("returned" in m.reasoning for m in after_tool)  # ... and reads what the tools said
    from k2post.chat.template import CHAT_TEMPLATES

    tokenizer = load_tokenizer(tiny_qwen2_dir)
    tokenizer.chat_template = CHAT_TEMPLATES["thinking"]  # reasoning is rendered (and trained) by thinking models
    data = load_sft_data(SFTDataConfig(path=str(tmp_path / "out" / "dataset"), eval_fraction=0.0), tokenizer)
    trained = tokenizer.decode([t for e in data.train for t, m in zip(e.input_ids, e.loss_mask) if m])
    assert trained.count("Next I call") == sum(
        1 for r in rows for m in json.loads(r["messages"]) if m["role"] == "assistant" and m.get("tool_calls")
    )  # every turn's reasoning is trained (once)
    off = run_synth(_cfg(tmp_path / "off", domains=["calculator"], mistake_rate=0.0, heldout_tasks_per_domain=0))
    assert off["accepted"] == len(rows)
    assert not any(
        "reasoning_content" in m for r in _rows(tmp_path / "off" / "dataset") for m in json.loads(r["messages"])
    )


def test_llm_agent_keeps_the_models_reasoning_only_when_asked():
    from k2post.chat.types import Message
    from k2post.llm.client import ChatResult
    from k2post.synth.roles import LLMAgent

    class Thinking:  # the ToolLLMClient seam: a reply with reasoning
        def chat_result(self, messages, tools=None, **kw):
            return ChatResult(message=Message(role="assistant", content="4", reasoning="2+2 is 4"))

    ask = [Message(role="user", content="2+2?")]
    assert LLMAgent(Thinking(), keep_reasoning=True).next_turn(ask, []).reasoning == "2+2 is 4"
    assert LLMAgent(Thinking()).next_turn(ask, []).reasoning is None
