"""A real `k2post serve` (vLLM api_server subprocess) on the tiny Qwen2: auth, chat, stop.

One server for the module (≈ 15 s to start on CPU); the last test stops it by its pid.
"""

from __future__ import annotations

import os

import httpx
import pytest

from k2post.chat.template import render_ids
from k2post.chat.types import Message
from k2post.llm import HTTPClientConfig, HTTPLLMClient, LLMClientError
from k2post.llm.serve import ServeConfig, ServerHandle, start_server

pytestmark = pytest.mark.slow

API_KEY = "test-key-123"
MESSAGES = [Message(role="user", content="What is 17 + 25?")]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def server(tiny_qwen2_dir, tmp_path_factory):
    cfg = ServeConfig(
        model_dir=str(tiny_qwen2_dir),
        port=0,
        api_key=API_KEY,
        served_model_name="tiny",
        max_model_len=512,
        startup_timeout_s=150,
        log_path=str(tmp_path_factory.mktemp("serve") / "server.log"),
    )
    handle = start_server(cfg)
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture(scope="module")
def client(server: ServerHandle):
    cfg = HTTPClientConfig(base_url=server.base_url, api_key=API_KEY, timeout_s=60, max_retries=1)
    with HTTPLLMClient(cfg) as http_client:
        yield http_client


def test_binds_loopback_and_enforces_api_key(server: ServerHandle):
    assert server.base_url.startswith("http://127.0.0.1:")
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    assert httpx.post(server.base_url + "/chat/completions", json=body, timeout=30).status_code == 401
    wrong = HTTPLLMClient(HTTPClientConfig(base_url=server.base_url, api_key="wrong", model="tiny"))
    with pytest.raises(LLMClientError, match="HTTP 401 after 1 attempt"):
        wrong.chat(MESSAGES, max_tokens=1)


def test_models_lists_served_name(client: HTTPLLMClient):
    assert client.models() == ["tiny"]


def test_chat_matches_in_process_engine(tiny_qwen2_dir, client: HTTPLLMClient):
    from k2post.models.loading import load_tokenizer
    from k2post.rollout.config import SamplingConfig, VLLMEngineConfig
    from k2post.rollout.vllm_engine import VLLMEngine

    result = client.chat_result(MESSAGES, temperature=0, max_tokens=MAX_TOKENS)
    assert result.finish_reason in ("stop", "length")
    assert result.usage["completion_tokens"] > 0 and result.raw_text
    prompt_ids = render_ids(load_tokenizer(tiny_qwen2_dir), MESSAGES, add_generation_prompt=True).input_ids
    assert result.usage["prompt_tokens"] == len(prompt_ids)  # the server used our K2 chat template
    engine = VLLMEngine(tiny_qwen2_dir, VLLMEngineConfig(dtype="float32", max_model_len=512, max_num_seqs=4))
    expected = engine.generate([prompt_ids], SamplingConfig(temperature=0.0, max_tokens=MAX_TOKENS))[0][0]
    assert result.raw_text == expected.text
    assert result.finish_reason == expected.finish_reason


def test_stop_ends_the_server_process_group(server: ServerHandle):
    pid = server.pid
    server.stop()
    assert not server.alive()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)
