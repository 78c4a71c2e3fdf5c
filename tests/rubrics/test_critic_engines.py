"""The critic against a real local model: the policy's in-process vLLM engine, and a served endpoint (slow).

The judge is tiny-qwen2 overfit (~40 s, lr 1e-3) into the failure mode both-order judging exists for: it
answers [[A]] to every judge prompt, whatever the responses (a pure position bias). A tiny
random-init model cannot learn to compare answers in a CPU-test budget (tried: 400 full-batch
steps stay at chance, docs/LOG.md), so this test checks what real engines add over the scripted
unit tests: the judge prompts render, go out in one batch, come back parseable, are counted
(calls, tokens), and both backends give the same verdicts. Through both backends:

- both orders: every pair's two verdicts disagree (A wins each time) -> ties, pairwise 0.5 for
  all, order_disagreement_rate 1.0; the praising response loses its prescriptive penalty;
- one order (drawn by the critic's RNG): every game goes to the response placed at A.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

from k2post.chat.template import render_ids
from k2post.chat.types import Message
from k2post.envs.base import Task
from k2post_rubrics.critic import Critic, CriticConfig
from k2post.judging.prompts import judge_messages
from k2post_rubrics.schema import builtin_rubrics

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "k2post" / "rollout"))
from tool_model import Trajectory, train_on  # noqa: E402

pytestmark = pytest.mark.slow

TASK = Task(
    id="math-x",
    env="math",
    task_type="math",
    messages=[Message(role="user", content="What is 2 + 2? Put your final answer in \\boxed{}.")],
    answer="4",
)
ANSWERS = ["\\boxed{5}", "\\boxed{4}", "Great question! \\boxed{4}"]
CONFIG = CriticConfig(rubric_kinds=["core"], max_tokens=8, prescriptive={"initial_praise_penalty": 0.5})


@pytest.fixture(scope="module")
def judge_dir(tiny_qwen2_dir, tmp_path_factory):
    from k2post.models.loading import load_tokenizer

    tokenizer = load_tokenizer(tiny_qwen2_dir)
    rubrics = builtin_rubrics(CONFIG.rubric_kinds)
    trajectories = []
    for a, b in itertools.permutations(range(3), 2):
        dialogue = judge_messages(TASK.messages, ANSWERS[a], ANSWERS[b], rubrics) + [
            Message(role="assistant", content="[[A]]")
        ]
        rendered = render_ids(tokenizer, dialogue)
        trajectories.append(Trajectory(TASK, rendered.input_ids, rendered.assistant_mask, dialogue[-1:]))
    out = tmp_path_factory.mktemp("judge") / "tiny-qwen2-judge"
    # lr 3e-3 spiked (CI: 1.30 at step 150); greedy needs the verdict's tokens on top, not a near-zero loss (0.03 =
    # each of the ~5 tokens above 0.99), and the test checks the greedy verdicts themselves
    worst = train_on(tiny_qwen2_dir, out, trajectories, max_steps=300, lr=1e-3, stop_below=0.03)
    assert worst < 0.03, f"the judge did not learn its verdict (worst loss {worst:.4f})"
    return out


def _check_both_orders(result) -> None:
    assert result.pairwise == pytest.approx([0.5, 0.5, 0.5]) and result.scores == pytest.approx([0.5, 0.5, 0.0])
    assert result.detector_hits[2] and not result.detector_hits[0] and not result.detector_hits[1]
    assert result.calls == 6 and result.unparseable == 0 and result.errors == 0 and result.position_a_wins == 6
    assert result.tokens_counted and result.prompt_tokens > 6 * 100 and result.completion_tokens >= 6
    metrics = Critic.metrics(result)
    assert metrics["critic/order_disagreement_rate"] == 1.0 and metrics["critic/position_a_rate"] == 1.0


def _check_one_order(result) -> None:
    assert result.calls == 3 and result.unparseable == 0 and result.position_a_wins == 3
    assert all(second is None for *_, second in result.comparisons)
    assert [s for *_, s in result.outcomes] == [1.0, 1.0, 1.0]  # (A index, B index, s): A always won


def test_in_process_engine_and_served_endpoint_judge_alike(judge_dir, tmp_path):
    from k2post.llm import HTTPClientConfig, HTTPLLMClient
    from k2post.llm.engine_client import EngineLLMClient
    from k2post.llm.serve import ServeConfig, start_server
    from k2post.rollout.config import VLLMEngineConfig
    from k2post.rollout.vllm_engine import VLLMEngine

    one_order = CONFIG.model_copy(update={"both_orders": False})
    engine = VLLMEngine(
        judge_dir, VLLMEngineConfig(dtype="float32", max_model_len=1024, max_num_seqs=8, kv_cache_gib=0.25)
    )
    try:
        local = Critic(EngineLLMClient(engine), CONFIG).score(TASK.messages, ANSWERS)
        local_one = Critic(EngineLLMClient(engine), one_order).score(TASK.messages, ANSWERS)
    finally:
        engine.close()
    _check_both_orders(local)
    _check_one_order(local_one)
    handle = start_server(
        ServeConfig(
            model_dir=str(judge_dir),
            port=0,
            served_model_name="judge",
            max_model_len=1024,
            startup_timeout_s=150,
            log_path=str(tmp_path / "server.log"),
        )
    )
    try:
        with HTTPLLMClient(HTTPClientConfig(base_url=handle.base_url, timeout_s=60, max_retries=1)) as client:
            served = Critic(client, CONFIG).score(TASK.messages, ANSWERS)
            served_one = Critic(client, one_order).score(TASK.messages, ANSWERS)
    finally:
        handle.stop()
    _check_both_orders(served)
    _check_one_order(served_one)
    assert [c[:2] + (c[2].winner,) for c in served.comparisons] == [c[:2] + (c[2].winner,) for c in local.comparisons]
    assert served_one.outcomes == local_one.outcomes  # same RNG seed -> same orientations
