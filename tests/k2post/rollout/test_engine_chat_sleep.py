"""`VLLMEngine.chat` (K2 template + tool-call parsing), the in-process `EngineLLMClient`, and
sleep()/wake_up() on CPU (the KV cache is freed and re-allocated), on the tool model's engine."""

from __future__ import annotations

import pytest

from k2post.llm.client import LLMClient, ToolLLMClient
from k2post.llm.engine_client import EngineLLMClient
from k2post.rollout.config import SamplingConfig
from k2post.rollout.engine import EngineAsleepError, RolloutEngine

pytestmark = pytest.mark.slow
GREEDY = SamplingConfig(temperature=0.0, max_tokens=96)


def test_engine_satisfies_the_seam(tool_engine):
    assert isinstance(tool_engine, RolloutEngine)


def test_chat_parses_the_tool_call_the_model_makes(tool_engine, bank_env, bank_tasks, tool_trajectories):
    task = bank_tasks[1]
    turn = tool_engine.chat([task.messages], GREEDY, tools=bank_env.tools_for(task))[0]
    expected = tool_trajectories[1].turns[0].tool_calls
    assert turn.message.tool_calls == expected and not turn.parse_errors
    assert turn.generation.finish_reason == "stop" and turn.generation.logprobs


def test_chat_reports_malformed_call(tool_engine, bank_env, bank_tasks):
    task = bank_tasks[0]  # the model's first call here has broken JSON
    turn = tool_engine.chat([task.messages], GREEDY, tools=bank_env.tools_for(task))[0]
    assert not turn.message.tool_calls
    assert [e.kind for e in turn.parse_errors] == ["bad_json"]


def test_engine_llm_client_round_trip(tool_engine, bank_env, bank_tasks, tool_trajectories):
    client = EngineLLMClient(tool_engine, GREEDY)
    assert isinstance(client, LLMClient) and isinstance(client, ToolLLMClient)
    task = bank_tasks[1]
    result = client.chat_result(task.messages, tools=bank_env.tools_for(task))
    assert result.message.tool_calls == tool_trajectories[1].turns[0].tool_calls
    assert "<|tool_call_begin|>" in result.raw_text and result.usage["completion_tokens"] > 0
    with pytest.raises(Exception, match="unknown sampling options"):
        client.chat(task.messages, temprature=0.5)


def test_sleep_frees_kv_cache_and_wake_up_restores_generation(tool_engine, bank_tasks):
    prompt = [[2, 17, 3, 40, 41, 42, 99]]
    before = tool_engine.generate(prompt, GREEDY)[0][0].token_ids
    kv_bytes = int(tool_engine.cfg.kv_cache_gib * 2**30)
    slept = tool_engine.sleep()
    assert slept.nbytes == kv_bytes
    assert slept.rss_before - slept.rss_after > 0.8 * kv_bytes  # the pages really went back to the OS
    with pytest.raises(EngineAsleepError, match="wake_up"):
        tool_engine.generate(prompt, GREEDY)
    with pytest.raises(EngineAsleepError):
        tool_engine.load_weights([])
    woke = tool_engine.wake_up()
    assert woke.nbytes == kv_bytes and not tool_engine.asleep
    assert tool_engine.generate(prompt, GREEDY)[0][0].token_ids == before
    assert tool_engine.wake_up().what == "already awake"
