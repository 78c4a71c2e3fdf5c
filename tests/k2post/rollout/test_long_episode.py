"""A 200-call tool episode on the real vLLM engine: context elision, memory bound, trainer view, resume mid-episode.

The model is tiny-qwen2 overfit (a few seconds) to one habit: after any tool result, think a line and call
`next_record()`. On the record_audit gym (199 records, none broken) that walks the whole ledger: 200 calls, ended
by the environment's `max_turns`. The rollout elides old turns whenever the context passes its budget, so the
engine's context stays far below what the unelided transcript (over 10,000 tokens) would need.
"""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest

from k2post.chat.template import render_continuation_ids, render_ids, render_transcript_ids
from k2post.chat.types import Message, ToolCall
from k2post.envs.registry import make_environment
from k2post.rl import batch as rb
from k2post.rl.controller import to_sample
from k2post.rollout.agentic import AgenticRollout, episode_context_stats, score_episode
from k2post.rollout.config import AgenticRolloutConfig, ContextConfig, SamplingConfig
from k2post.rollout.context import elided_prompt_ids, elide_messages

pytestmark = pytest.mark.slow

CALLS = 200
CONTEXT = ContextConfig(enabled=True, budget_tokens=900, keep_last_turns=2, placeholder="[earlier turns elided]")
MAX_MODEL_LEN = 1280
TURN_TOKENS, OBSERVATION_TOKENS = 48, 64


def _turn() -> Message:
    call = ToolCall(id="functions.next_record:0", name="next_record", arguments={})
    return Message(role="assistant", reasoning="read the next record", tool_calls=[call])


@pytest.fixture(scope="module")
def audit_env():
    return make_environment("record_audit", {"n_records": CALLS - 1, "broken_fraction": 0.0, "max_turns": CALLS})


@pytest.fixture(scope="module")
def walker_dir(tiny_qwen2_dir, audit_env, tmp_path_factory):
    """tiny-qwen2 trained to answer every tool result with the same thought and `next_record()` call, in plain
    and in elided contexts."""
    from k2post.models.loading import load_tokenizer
    from tool_model import Trajectory, train_on

    tokenizer = load_tokenizer(tiny_qwen2_dir)
    tools, trajectories = audit_env.tools(), []
    for task in audit_env.tasks("train", seed=7, n=3):  # several ledgers: the habit, not one ledger's records
        state, rest = audit_env.reset(task), []
        for _ in range(8):
            rest += [_turn(), *audit_env.step(state, _turn()).observations]
        plain = render_ids(tokenizer, task.messages, tools=tools)
        cont = render_continuation_ids(tokenizer, rest, add_generation_prompt=False)
        trajectories.append(
            Trajectory(task, plain.input_ids + cont.input_ids, plain.assistant_mask + cont.assistant_mask, [])
        )
        elided, _ = elide_messages([*task.messages, *rest[:6]], 2, CONTEXT.placeholder)  # a window after an elision
        cut = render_transcript_ids(tokenizer, [*elided, *rest[6:]], tools, add_generation_prompt=False)
        trajectories.append(Trajectory(task, cut.input_ids, cut.assistant_mask, []))
    out = tmp_path_factory.mktemp("walker") / "tiny-qwen2-walker"
    assert train_on(tiny_qwen2_dir, out, trajectories, max_steps=300) < 0.01
    return out


@pytest.fixture(scope="module")
def walker_engine(walker_dir):
    from k2post.rollout.config import VLLMEngineConfig
    from k2post.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine(walker_dir, VLLMEngineConfig(dtype="float32", max_model_len=MAX_MODEL_LEN, kv_cache_gib=0.25))
    yield engine
    engine.close()


def _runner(engine, env, **cfg) -> AgenticRollout:
    rollout_cfg = AgenticRolloutConfig(
        max_turns=CALLS + 10,
        max_turn_tokens=TURN_TOKENS,
        max_episode_tokens=50_000,
        max_observation_tokens=OBSERVATION_TOKENS,
        context=CONTEXT,
        **cfg,
    )
    return AgenticRollout(engine, {"record_audit": env}, rollout_cfg, SamplingConfig(temperature=0.0, max_tokens=48))


def test_200_call_episode_elides_within_a_bounded_context_and_the_trainer_sees_what_the_engine_saw(
    walker_engine, audit_env
):
    runner = _runner(walker_engine, audit_env)
    task = next(audit_env.tasks("test", seed=0))
    episode = runner.start("record_audit", task)
    runner.run_iteration([episode])
    assert episode.finish_reason == "env_done" and episode.state.calls == CALLS
    assert score_episode(audit_env, episode).info["checkpoint_pass_rate"] == 1.0  # every block fetched
    stats = episode_context_stats(episode)
    print("long episode:", stats, "windows", len(episode.windows) + 1)
    unelided = len(render_transcript_ids(walker_engine.tokenizer, episode.messages, episode.tools).input_ids)
    print("unelided transcript tokens:", unelided)
    assert unelided > 10 * MAX_MODEL_LEN and stats["elisions"] > 20
    windows = [*episode.windows, episode]
    # memory bound: no generation saw more than the budget plus one turn and its result, far below unelided
    assert stats["context_peak"] <= CONTEXT.budget_tokens + TURN_TOKENS < MAX_MODEL_LEN
    assert all(len(w.token_ids) <= CONTEXT.budget_tokens + TURN_TOKENS + OBSERVATION_TOKENS + 16 for w in windows)
    # each window's prompt is the rule applied to the dialogue so far; its model tokens are what the engine wrote
    for before, window in zip(windows, windows[1:]):
        prompt = elided_prompt_ids(walker_engine.tokenizer, episode.messages[: before.messages], episode.tools, CONTEXT)
        assert window.token_ids[: len(prompt)] == prompt and not any(window.loss_mask[: len(prompt)])
    written = sum(sum(w.loss_mask) for w in windows)
    assert written == episode.generated_tokens
    # the trainer's rows are exactly those windows, one row each, with the episode's advantage
    sampled_at = replace(episode, id="g/0", temperature=1.0)  # greedy here; RL episodes carry their temperature
    sample = to_sample(sampled_at, score_episode(audit_env, episode))
    rows = rb.sample_rows(sample, advantage=0.25)
    assert [r.token_ids for r in rows] == [episode.token_ids, *(w.token_ids for w in episode.windows)]
    assert {r.advantage for r in rows} == {0.25} and sample.response_tokens == written
    assert {r.temperature for r in rows} == {1.0}  # every window trains at the episode's sampling temperature


def test_resume_mid_episode_after_a_checkpoint_continues_it_exactly(walker_engine):
    calls = 80
    audit_env = make_environment("record_audit", {"n_records": calls - 1, "broken_fraction": 0.0, "max_turns": calls})
    task = next(audit_env.tasks("test", seed=1))
    straight = _runner(walker_engine, audit_env)
    reference = straight.start("record_audit", task, "ref")
    pausing = _runner(walker_engine, audit_env, iteration_token_budget=1000)
    paused = pausing.run_iteration([pausing.start("record_audit", task, "cut")]).paused
    assert len(paused) == 1 and paused[0].windows and paused[0].state.calls < calls  # stopped mid-episode
    resumed = pickle.loads(pickle.dumps(paused[0]))  # what an RL checkpoint stores and a restarted run loads
    straight.run_iteration([reference, resumed])  # both to the end, stepped together
    assert resumed.finish_reason == reference.finish_reason == "env_done"
    assert resumed.state.calls == reference.state.calls == calls
    assert [w.token_ids for w in resumed.windows] == [w.token_ids for w in reference.windows]
    assert resumed.token_ids == reference.token_ids
