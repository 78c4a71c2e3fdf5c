"""Every LLM role of the synthesis against a real local vLLM server (`k2post serve`, tiny Qwen2).

The tiny model writes junk, so trajectories get rejected — what is tested is the seam: the HTTP
LLMClient drives the agent, the user and tool simulators and the judge, replies are parsed without
eval, and junk ends up as recorded rejects instead of crashes. The rephraser's LLM rewriter and judge
(`k2post rephrase`, backend llm) share the server: junk rewrites end up dropped and counted.
"""

from __future__ import annotations

import json

import pytest

from k2post.chat.types import Message
from k2post.llm import HTTPClientConfig, HTTPLLMClient
from k2post.llm.serve import ServeConfig, start_server
from k2post.synth.config import SynthConfig
from k2post.synth.domains import build_domains
from k2post.synth.pipeline import read_shards, run_synth
from k2post.synth.roles import LLMAgent, LLMToolSimulator, LLMUser
from k2post.synth.tasks import make_tasks

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tiny_qwen2_dir, tmp_path_factory):
    cfg = ServeConfig(
        model_dir=str(tiny_qwen2_dir),
        port=0,
        served_model_name="tiny",
        max_model_len=2048,
        startup_timeout_s=150,
        log_path=str(tmp_path_factory.mktemp("serve") / "server.log"),
    )
    handle = start_server(cfg)
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture(scope="module")
def client_cfg(server):
    return HTTPClientConfig(base_url=server.base_url, timeout_s=60, max_retries=1)


def test_llm_roles_answer_through_the_server(client_cfg):
    domain = build_domains(["inventory"])["inventory"]
    task = make_tasks(domain, "train", 1, seed=0, personas=["polite"])[0]
    with HTTPLLMClient(client_cfg) as client:
        sim = LLMToolSimulator(client, domain.tools(), "a warehouse", max_tokens=16, temperature=0.0)
        result = sim.call("get_item", {"name": "bolts"})
        assert result and sim.history == [("get_item", {"name": "bolts"}, result)]
        assert sim.call("fly", {}).startswith("Error: unknown tool")
        assert isinstance(LLMUser(client, task, max_tokens=16, temperature=0.0).opening(), str)
        turn = LLMAgent(client, max_tokens=16, temperature=0.0).next_turn(
            [Message(role="user", content=task.scenario.prompt)], domain.tools()
        )
        assert turn.role == "assistant"


def test_synthesis_with_every_role_on_the_llm(tmp_path, client_cfg):
    cfg = SynthConfig(
        out_dir=str(tmp_path / "out"),
        domains=["inventory"],
        tasks_per_domain=2,
        heldout_tasks_per_domain=0,
        attempts_per_task=1,
        agent="llm",
        user_simulator="llm",
        tool_simulator="llm",
        judge="rubric+llm",
        llm=client_cfg,
        llm_sampling={"temperature": 0.7, "max_tokens": 24},
        max_turns=2,
    )
    stats = run_synth(cfg)
    rows = read_shards(tmp_path / "out" / "shards")
    assert stats["trajectories"] == len(rows) == 2
    for row in rows:
        assert row["metadata"]["agent"] == "llm"
        verdict = row["verdict"]
        assert verdict["accepted"] or verdict["reasons"]  # junk is a recorded reject, not a crash
        if not verdict["error"]:
            assert verdict["judge"] == "rubric+llm"


def test_own_prompts_continued_and_judged_by_the_llm(tmp_path, client_cfg):
    chats = tmp_path / "chats.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi!"}]},
        {"messages": [{"role": "user", "content": "Weather in Oslo?"}], "tools": [{"type": "function", "function": {
            "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]},
    ]  # fmt: skip
    chats.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    cfg = SynthConfig(
        out_dir=str(tmp_path / "out"), domains=[], prompt_datasets=[{"path": str(chats), "label": "mine"}],
        agent="llm", judge="llm", llm=client_cfg, llm_sampling={"temperature": 0.7, "max_tokens": 24}, max_turns=2,
    )  # fmt: skip
    stats = run_synth(cfg)
    written = read_shards(tmp_path / "out" / "shards")
    assert stats["trajectories"] == len(written) == 2 and {r["domain"] for r in written} == {"mine"}
    for row in written:
        assert row["id"].startswith("mine/row-") and row["messages"][0]["role"] == "user"
        assert row["verdict"]["accepted"] or row["verdict"]["reasons"]  # junk is a recorded reject


def test_rephrase_rewrites_and_judges_through_the_server(tmp_path, client_cfg):
    """`k2post rephrase` with backend llm and fidelity_judge llm on the same server: junk rewrites are dropped and
    counted (dropped.jsonl), nothing crashes, the dataset is written; the judge call itself (reached only by a rewrite
    that passes the checks, which junk never does) is asked directly."""
    from datasets import load_from_disk

    from k2post.rephrase.config import RephraseConfig
    from k2post.rephrase.fidelity import LLMChunkJudge
    from k2post.rephrase.pipeline import run_rephrase

    with HTTPLLMClient(client_cfg) as client:
        verdict = LLMChunkJudge(client, max_tokens=8).judge("Tor has 12 cats.", "Tor owns 12 cats.")
    assert verdict.reason.startswith(("judge: ", "unparseable judge reply"))  # junk is a verdict, not a crash

    docs = tmp_path / "docs.jsonl"
    rows = [{"id": "a", "text": "Kalo was born in 1931. Kalo lives in Minal."}, {"id": "b", "text": "Tor has 12 cats."}]
    docs.write_text("".join(json.dumps(row) + "\n" for row in rows))
    cfg = RephraseConfig(
        out_dir=str(tmp_path / "out"), input={"path": str(docs)}, backend="llm", fidelity_judge="llm", llm=client_cfg,
        llm_sampling={"temperature": 0.7, "max_tokens": 16, "judge_max_tokens": 8}, max_retries=0, chunk_tokens=16,
    )  # fmt: skip
    stats = run_rephrase(cfg)
    dropped = (tmp_path / "out" / "dropped.jsonl").read_text().splitlines()
    assert stats["documents"] == 2 and stats["rewrites_kept"] + stats["rewrites_dropped"] == 2
    assert len(dropped) == stats["rewrites_dropped"] and all(json.loads(line)["reason"] for line in dropped)
    assert len(load_from_disk(str(tmp_path / "out" / "dataset"))) == stats["rewrites_kept"]
