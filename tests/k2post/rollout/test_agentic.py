"""Agentic rollouts with the real vLLM engine against the real tool_use gym.

The engine serves a tiny model trained to solve three bank tasks (tool_model.py); task 0's first
call is malformed in its training data, so the model really emits a broken call, reads the
rollout's error message and retries. Greedy decoding makes each transcript equal the reference.
"""

from __future__ import annotations

import pytest
from safetensors.torch import load_file

from k2post.chat.types import Message
from k2post.envs.base import Reward
from k2post.rollout.agentic import (
    AgenticRollout,
    EpisodeOptions,
    count_reasoning,
    parse_error_messages,
    score_episode,
    truncate_observation,
)
from k2post.rollout.config import AgenticRolloutConfig, SamplingConfig

GREEDY = SamplingConfig(temperature=0.0, max_tokens=128)


@pytest.fixture(scope="module")
def engine(tool_engine):
    return tool_engine


def _runner(engine, bank_env, **cfg) -> AgenticRollout:
    rollout_cfg = AgenticRolloutConfig(**{"max_turn_tokens": 128, "max_episode_tokens": 512, **cfg})
    return AgenticRollout(engine, {"tool_use": bank_env}, rollout_cfg, GREEDY)


@pytest.mark.slow
def test_concurrent_episodes_solve_tasks_and_match_reference(engine, bank_env, bank_tasks, tool_trajectories):
    runner = _runner(engine, bank_env)
    episodes = [runner.start("tool_use", task) for task in bank_tasks]
    result = runner.run_iteration(episodes)
    assert not result.paused and len(result.finished) == len(bank_tasks)
    assert result.rounds >= 3  # several turns each, stepped together
    for episode, reference in zip(episodes, tool_trajectories):
        assert episode.finish_reason == "env_done" and not episode.truncated
        assert episode.token_ids == reference.ids
        assert episode.loss_mask == reference.mask  # exactly the assistant tokens are marked
        assert len(episode.logprobs) == len(episode.versions) == len(episode.token_ids)
        assert all(lp <= 0 for lp, m in zip(episode.logprobs, episode.loss_mask) if m)
        assert score_episode(bank_env, episode).value == 1.0
        assert episode.turns == len(reference.turns)


@pytest.mark.slow
def test_episode_options_set_the_episodes_id_seed_temperature_and_budget(engine, bank_env, bank_tasks):
    runner = _runner(engine, bank_env)
    episode = runner.start("tool_use", bank_tasks[0], "e/0", EpisodeOptions(seed=7, temperature=0.5, max_tokens=9))
    assert (episode.id, episode.seed, episode.temperature, episode.max_tokens) == ("e/0", 7, 0.5, 9)
    plain = runner.start("tool_use", bank_tasks[0])
    assert (plain.id, plain.seed, plain.temperature, plain.max_tokens) == (bank_tasks[0].id, None, None, None)


B, E = 100, 101  # stand-ins for the <think> and </think> ids


@pytest.mark.parametrize(
    ("ids", "in_think", "remaining", "expected"),
    [
        ([B, 1, 2, E, 3], False, None, (2, None, False)),  # tags are not reasoning, content after </think> neither
        ([1, 2, 3], True, None, (3, None, True)),  # resumed inside an open <think>
        ([1, 2, 3], False, None, (0, None, False)),  # no think at all
        ([B, 1, 2, 3, 4], False, 2, (2, 3, True)),  # budget 2: cut after the 2nd reasoning token
        ([B, 1, E, B, 2, 3, E], False, 2, (2, 5, True)),  # counted over several think blocks
        ([B, 1, E, 5, 6], False, 2, (1, None, False)),  # under budget: nothing cut
        ([1, E, B, 2], True, 1, (1, 1, True)),
    ],
)
def test_count_reasoning(ids, in_think, remaining, expected):
    assert count_reasoning(ids, in_think, (B, E), remaining) == expected


@pytest.mark.slow
def test_reasoning_budget_cuts_the_turn_and_ends_the_episode(engine, bank_env, bank_tasks):
    from k2post.rollout.engine import Generation

    runner = _runner(engine, bank_env)
    begin, end = runner.think_ids
    episode = runner.start("tool_use", bank_tasks[0], options=EpisodeOptions(max_reasoning_tokens=5))
    first = Generation([], [begin, 70, 80, 90], [-0.1] * 4)
    cut, over = runner._reasoning_cut(episode, first)
    assert (cut.token_ids, over, episode.reasoning_tokens, episode.in_think) == ([begin, 70, 80, 90], False, 3, True)
    runner._take_generation(episode, cut, 0, 0)
    second = Generation([], [50, 51, 52, end, 53], [-0.2] * 5, finish_reason="stop")
    cut, over = runner._reasoning_cut(episode, second)  # 2 left: cut after token 51
    assert (cut.token_ids, cut.logprobs, cut.finish_reason, over) == ([50, 51], [-0.2, -0.2], "length", True)
    assert episode.reasoning_tokens == 5
    # the real model writes no reasoning: a 1-token reasoning budget never fires
    plain = runner.start("tool_use", bank_tasks[1], options=EpisodeOptions(max_reasoning_tokens=1))
    runner.run_iteration([plain])
    assert plain.finish_reason == "env_done" and plain.reasoning_tokens == 0


@pytest.mark.slow
def test_malformed_tool_call_becomes_error_message_not_crash(engine, bank_env, bank_tasks):
    runner = _runner(engine, bank_env)
    episode = runner.start("tool_use", bank_tasks[0])
    runner.run_iteration([episode])
    assert episode.errors and "arguments are not valid JSON" in episode.errors[0]
    tool_errors = [m for m in episode.messages if m.role == "tool" and m.content.startswith("Error: tool call 0")]
    assert len(tool_errors) == 1  # the model read the error ...
    assert episode.finish_reason == "env_done" and score_episode(bank_env, episode).value == 1.0  # ... and recovered
    assert len(episode.env_turns) == episode.turns - 1  # the broken turn never reached the environment


@pytest.mark.slow
def test_partial_rollout_pauses_resumes_and_records_versions(
    tool_model_dir, engine, bank_env, bank_tasks, tool_trajectories
):
    weights = sorted(load_file(str(tool_model_dir / "model.safetensors")).items())
    runner = _runner(engine, bank_env, iteration_token_budget=40)
    pending = [runner.start("tool_use", task) for task in bank_tasks]
    finished, iterations, paused_counts = [], 0, []
    while pending:
        result = runner.run_iteration(pending, iteration=iterations)
        finished += result.finished
        paused_counts.append(len(result.paused))
        assert all(e.status == "paused" for e in result.paused)
        pending = result.paused
        iterations += 1
        version = engine.weights_version
        engine.load_weights(weights)  # a real in-place push of equal weights: greedy still replays
        assert engine.weights_version == version + 1
        assert iterations < 40
    assert paused_counts[0] == len(bank_tasks) and iterations > 2
    by_id = {e.id: e for e in finished}
    for task, reference in zip(bank_tasks, tool_trajectories):
        episode = by_id[task.id]
        assert episode.token_ids == reference.ids  # pausing mid-turn and resuming loses nothing
        assert len(episode.policy_versions()) > 1
        for segment in episode.segments:
            assert segment.end - segment.start <= 40
            assert set(episode.versions[segment.start : segment.end]) == {segment.policy_version}
        written = [v for v, m in zip(episode.versions, episode.loss_mask) if m]
        assert written == sorted(written)  # later tokens come from the same or newer policy
        assert all(v == -1 for v, m in zip(episode.versions, episode.loss_mask) if not m)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("cfg", "reason"),
    [
        ({"max_turns": 1}, "max_turns"),
        ({"max_episode_tokens": 30, "max_turn_tokens": 30}, "episode_budget"),
        ({"max_turn_tokens": 8}, "turn_budget"),
    ],
)
def test_limits_truncate_episodes(engine, bank_env, bank_tasks, cfg, reason):
    runner = _runner(engine, bank_env, **cfg)
    episodes = [runner.start("tool_use", task) for task in bank_tasks]
    result = runner.run_iteration(episodes)
    assert [e.finish_reason for e in result.finished] == [reason] * len(bank_tasks)
    assert all(e.truncated for e in result.finished)
    assert all(e.generated_tokens <= runner.cfg.max_episode_tokens for e in result.finished)


@pytest.mark.slow
def test_context_limit_ends_episode(engine, bank_env, bank_tasks):
    probe = _runner(engine, bank_env).start("tool_use", bank_tasks[2])
    limit = probe.prompt_len + 60  # room for about one turn
    runner = AgenticRollout(engine, {"tool_use": bank_env}, AgenticRolloutConfig(), GREEDY, max_model_len=limit)
    episode = runner.start("tool_use", bank_tasks[2])
    runner.run_iteration([episode])
    assert episode.finish_reason == "context_limit" and episode.generated_tokens > 0
    assert max(i for i, m in enumerate(episode.loss_mask) if m) < limit  # the model never wrote past it
    too_long = AgenticRollout(
        engine, {"tool_use": bank_env}, AgenticRolloutConfig(), GREEDY, max_model_len=probe.prompt_len - 1
    )
    assert (
        too_long.run_iteration([too_long.start("tool_use", bank_tasks[2])]).finished[0].finish_reason == "context_limit"
    )


@pytest.mark.slow
def test_crashing_environment_ends_only_its_episode(engine, bank_env, bank_tasks):
    from k2post_environments.tool_use import ToolUseEnv

    class CrashingOnSecondStep(ToolUseEnv):
        def step(self, state, assistant):
            if state.turns >= 1:
                raise RuntimeError("simulator bug")
            return super().step(state, assistant)

    crashing = CrashingOnSecondStep(bank_env.config)
    runner = AgenticRollout(
        engine, {"tool_use": bank_env, "crashing": crashing}, AgenticRolloutConfig(max_turn_tokens=128), GREEDY
    )
    episodes = [runner.start("crashing", bank_tasks[1], "crash"), runner.start("tool_use", bank_tasks[1], "ok")]
    runner.run_iteration(episodes)
    assert episodes[0].finish_reason == "env_error" and "simulator bug" in episodes[0].errors[-1]
    assert episodes[1].finish_reason == "env_done" and score_episode(bank_env, episodes[1]).value == 1.0


def test_long_observation_is_cut(tiny_qwen2_dir):
    from k2post.models.loading import load_tokenizer

    tokenizer = load_tokenizer(tiny_qwen2_dir)
    message = Message(role="tool", tool_call_id="functions.x:0", content="word " * 2000)
    cut = truncate_observation(tokenizer, message, 50)
    assert len(tokenizer(cut.content, add_special_tokens=False)["input_ids"]) <= 70
    assert "tokens cut]" in cut.content and cut.tool_call_id == "functions.x:0"
    assert truncate_observation(tokenizer, cut.model_copy(update={"content": "short"}), 50).content == "short"


def test_parse_errors_become_tool_messages():
    from k2post.chat.parse import parse_assistant

    parsed = parse_assistant(
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.pay:3<|tool_call_argument_begin|>{oops<|tool_call_end|>"
        "<|tool_calls_section_end|>trailing",
        start_index=3,
    )
    messages = parse_error_messages(parsed.errors, first_index=3)
    assert messages and all(m.role == "tool" and m.content.startswith("Error: ") for m in messages)
    assert "functions.pay:3" in [m.tool_call_id for m in messages]  # the readable id is answered
    assert all(m.tool_call_id for m in messages)


def test_episode_tool_stats_count_calls_refusals_and_tool_errors(bank_tasks):
    from k2post.chat.types import ToolCall
    from k2post.rollout.agentic import Episode, episode_tool_stats

    call = ToolCall(id="functions.multiply:0", name="multiply", arguments={"a": 12, "b": 34})
    messages = [
        Message(role="user", content="12 * 34?"),
        Message(
            role="assistant", content="", tool_calls=[call, call.model_copy(update={"id": "functions.multiply:1"})]
        ),
        Message(role="tool", tool_call_id="functions.multiply:0", content="408"),
        Message(role="tool", tool_call_id="functions.multiply:1", content="Error: b must be a number"),
        Message(role="assistant", content="<|tool_calls_section_begin|>{oops"),
        Message(role="tool", tool_call_id="functions.invalid:2", content="Error: unterminated tool call"),
        Message(role="assistant", content="The answer is 408."),
    ]
    episode = Episode(
        id="x",
        env_name="tool_use",
        task=bank_tasks[0],
        state=None,
        tools=[],
        messages=messages,
        token_ids=[],
        prompt_len=0,
        turns=3,
        errors=["unterminated tool call"],
    )
    assert episode_tool_stats(episode) == {"turns": 3, "tool_calls": 2, "malformed_calls": 1, "tool_errors": 1}


def test_score_episode_turns_scorer_crash_into_floor_reward(bank_env, bank_tasks):
    from k2post.rollout.agentic import Episode

    episode = Episode(
        id="x",
        env_name="tool_use",
        task=bank_tasks[0],
        state={"not": "a state"},
        tools=[],
        messages=[],
        token_ids=[],
        prompt_len=0,
    )
    reward = score_episode(bank_env, episode)
    assert isinstance(reward, Reward) and reward.value == 0.0 and reward.error
    assert "(at environments/tool_use.py:" in reward.error  # the first error line names the scorer's file:line


@pytest.mark.parametrize("value, error", [(2.0, "outside the env's reward_range [0, 1]"), (1.0, None)])
def test_score_episode_turns_an_out_of_range_reward_into_an_error(bank_tasks, value, error):
    """The rollout's in-actor scoring checks the range like the reward workers do."""
    from k2post.rollout.agentic import Episode

    class Fixed:  # a single-turn env whose scorer returns `value`
        reward_range = (0.0, 1.0)

        def score(self, task, response):
            return Reward(value=value)

    episode = Episode(
        id="x", env_name="fixed", task=bank_tasks[0], state=None, tools=[], messages=[], token_ids=[], prompt_len=0
    )
    reward = score_episode(Fixed(), episode)
    assert reward.value == (0.0 if error else value)
    assert (reward.error is None) if error is None else (error in reward.error)


@pytest.mark.slow
def test_single_turn_environment_takes_one_turn(engine):
    from k2post.envs.registry import make_environment

    math_env = make_environment("math")
    tasks = list(math_env.tasks("train", seed=0, n=4))
    runner = AgenticRollout(
        engine, {"math": math_env}, AgenticRolloutConfig(max_turn_tokens=32, max_episode_tokens=64), GREEDY
    )
    result = runner.run_iteration([runner.start("math", task) for task in tasks])
    assert len(result.finished) == 4 and result.rounds == 1
    for episode in result.finished:
        assert episode.turns <= 1 and episode.finish_reason in ("env_done", "turn_budget")
        assert episode.env_turns == [] and episode.tools == []
        reward = score_episode(math_env, episode)
        assert reward.error is None and 0.0 <= reward.value <= 1.0


class _FlakySandboxEnv:
    """An env whose sandbox fails `failures` times (an infrastructure error), then scores 1."""

    reward_range = (0.0, 1.0)

    def __init__(self, failures: int) -> None:
        self.failures, self.calls = failures, 0

    def score(self, task, response):
        self.calls += 1
        if self.calls <= self.failures:
            return Reward(value=0.0, error="sandbox failed: setup failed", infra_failure=True)
        return Reward(value=1.0)


@pytest.mark.parametrize("failures, value, infra, calls", [(0, 1.0, False, 1), (1, 1.0, False, 2), (2, 0.0, True, 2)])
def test_score_episode_rescores_an_infrastructure_failure_once(failures, value, infra, calls):
    from types import SimpleNamespace

    env = _FlakySandboxEnv(failures)
    episode = SimpleNamespace(task=None, messages=[Message(role="assistant", content="x")])
    reward = score_episode(env, episode)  # type: ignore[arg-type]
    assert (reward.value, reward.infra_failure, env.calls) == (value, infra, calls)
