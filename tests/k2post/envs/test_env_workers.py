"""RewardPool: isolation, timeouts with kill + replace, crash recovery, multi-turn items, stats."""

from __future__ import annotations

import os
import time
from pathlib import Path

import k2post_toy_envs
import pytest

from k2post.chat.types import Message, ToolCall
from k2post.envs import make_environment
from k2post.envs.workers import DirectScorer, RewardPool, RewardPoolError, ScoreItem

TIMEOUT_S = 1.0
TOY_FILE = os.path.relpath(k2post_toy_envs.__file__)  # tests run from the repo root: error texts show it relative
TOY_LINES = Path(k2post_toy_envs.__file__).read_text().splitlines()
RAISE_LINE = TOY_LINES.index('            raise ValueError("bad response")') + 1
AT_RAISE = f"(at {TOY_FILE}:{RAISE_LINE})"
AT_DEF = f"(at {TOY_FILE}:{k2post_toy_envs.ToyFaulty.score.__code__.co_firstlineno})"


@pytest.fixture(scope="module")
def pool():
    with RewardPool(num_workers=2, timeout_s=TIMEOUT_S) as reward_pool:
        yield reward_pool


def _task(env_name: str, index: int = 0, **config):
    tasks = make_environment(env_name, config).tasks("train", seed=0, n=index + 1)
    return list(tasks)[index]


def test_batch_keeps_order_and_scores(pool):
    task = _task("toy_echo")
    responses = [task.answer, "nope", f"say {task.answer}", task.answer]
    rewards = pool.score_batch([("toy_echo", {}, task, r) for r in responses])
    assert [r.value for r in rewards] == [1.0, 0.0, 0.5, 1.0]
    assert rewards[0].breakdown == {"exact": 1.0, "contains": 1.0}
    assert all(r.error is None for r in rewards)


@pytest.mark.parametrize(
    "response, error",
    [
        ("raise", "ValueError: bad response"),
        ("sysexit", "SystemExit: 1"),
        ("nan", "ValueError: ToyFaulty.score returned a non-finite reward nan"),
        ("notreward", "TypeError: ToyFaulty.score returned str, expected a Reward or a float"),
        ("float:1.5", "ValueError: ToyFaulty.score returned 1.5, outside the env's reward_range [0, 1]"),
        ("unpicklable", "reward does not pickle: "),
        ("exit", "reward worker died (exit code 3)"),
        ("value:2.0", "ValueError: ToyFaulty.score returned 2.0, outside the env's reward_range [0, 1]"),
        ("value:-0.5", "ValueError: ToyFaulty.score returned -0.5, outside the env's reward_range [0, 1]"),
    ],
)
def test_failures_become_error_rewards(pool, response, error):
    task = _task("toy_faulty")
    reward, after = pool.score_batch([("toy_faulty", {}, task, response), ("toy_faulty", {}, task, "fine")])
    assert reward.value == 0.0 and reward.error.startswith(error)
    assert after.value == 1.0 and after.error is None


@pytest.mark.parametrize(
    "response, value, error",
    [
        ("value:2.0", 0.0, f"ValueError: ToyFaulty.score returned 2.0, outside the env's reward_range [0, 1] {AT_DEF}"),
        ("value:1.0", 1.0, None),
        ("value:0.0", 0.0, None),
        ("raise", 0.0, f"ValueError: bad response {AT_RAISE}"),
    ],
)
def test_direct_scorer_clips_out_of_range_rewards_to_an_error(response, value, error):
    scorer = DirectScorer()
    (reward,) = scorer.score_batch([("toy_faulty", {}, _task("toy_faulty"), response)])
    assert (reward.value, reward.error) == (value, error)
    assert scorer.stats.errors == (error is not None)


def test_hang_times_out_kills_and_replaces_worker(pool):
    task = _task("toy_faulty")
    before = set(pool.worker_pids())
    restarts = pool.stats.restarts
    start = time.monotonic()
    rewards = pool.score_batch([("toy_faulty", {}, task, "hang")] + [("toy_faulty", {}, task, "ok")] * 4)
    assert time.monotonic() - start < 2 * TIMEOUT_S + 10
    assert rewards[0].error == f"timeout after {TIMEOUT_S}s" and rewards[0].value == 0.0
    assert rewards[0].infra_failure  # the pool's own timeout: re-scored once, timed out again
    assert [r.value for r in rewards[1:]] == [1.0] * 4
    assert pool.stats.restarts == restarts + 2 and pool.stats.timeouts >= 2
    after = set(pool.worker_pids())
    assert len(after) == 2 and 1 <= len(before - after) <= 2
    for pid in before - after:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_worker_killed_mid_job_is_rescored_once(pool, tmp_path):
    """Infrastructure faults are not rewards: a worker that dies while scoring a (correct) response gets the
    response re-scored once (right reward, no error); one that dies both times gives an infrastructure error the
    RL loop leaves out of training (tests/k2post/rl/test_infra_failures.py), never a plain 0."""
    task = _task("toy_faulty")
    rescored, infra = pool.stats.rescored, pool.stats.infra_failures
    once, always, fine = pool.score_batch(
        [("toy_faulty", {}, task, f"exit_once:{tmp_path / 'died'}"), ("toy_faulty", {}, task, "exit"),
         ("toy_faulty", {}, task, "fine")]
    )  # fmt: skip
    assert (once.value, once.error, once.infra_failure) == (1.0, None, False)
    assert always.value == 0.0 and always.infra_failure and always.error == "reward worker died (exit code 3)"
    assert (fine.value, fine.infra_failure) == (1.0, False)
    assert pool.stats.rescored == rescored + 2 and pool.stats.infra_failures == infra + 1


@pytest.mark.parametrize(
    "response, infra",
    [("raise", False), ("sysexit", False), ("nan", False), ("float:1.5", False), ("exit", True), ("hang", True)],
)
def test_only_infrastructure_failures_are_flagged(response, infra):
    """An error the scorer raises on the response is the response's (a failed response, never re-scored); a dead
    worker or the pool's own timeout is the infrastructure's."""
    with RewardPool(num_workers=1, timeout_s=TIMEOUT_S) as own:
        reward = own.score(("toy_faulty", {}, _task("toy_faulty"), response))
        assert reward.error is not None and reward.infra_failure is infra
        assert own.stats.rescored == int(infra)


def test_timeout_kills_the_workers_children_too(pool, tmp_path):
    pid_file = tmp_path / "child.pid"
    reward = pool.score(("toy_faulty", {}, _task("toy_faulty"), f"child:{pid_file}"))
    assert reward.error == f"timeout after {TIMEOUT_S}s"
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.05)
    assert not _alive(child), "the sandbox-like child of a killed worker survived"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_unknown_env_and_bad_config_are_error_rewards(pool):
    task = _task("toy_echo")
    unknown, bad_config = pool.score_batch([("toy_ecko", {}, task, "x"), ("toy_echo", {"uper": True}, task, "x")])
    assert unknown.error == "EnvironmentRegistryError: unknown environment 'toy_ecko' (did you mean 'toy_echo'?)"
    assert bad_config.error == "ValueError: environment 'toy_echo' config: uper: unknown key (did you mean 'upper'?)"


def test_env_instances_are_cached_per_config(pool):
    task = _task("toy_echo", upper=True)
    rewards = pool.score_batch([("toy_echo", {"upper": True}, task, task.answer), ("toy_echo", {}, task, task.answer)])
    assert [r.value for r in rewards] == [1.0, 1.0]  # score only compares with task.answer


def test_slow_setup_does_not_count_against_the_call_timeout(pool):
    task = _task("toy_faulty")
    reward = pool.score(("toy_faulty", {"setup_delay_s": TIMEOUT_S * 1.5}, task, "ok"))
    assert reward.value == 1.0 and reward.error is None


def test_setup_timeout_is_reported():
    # the setup timeout also bounds the worker's start (a python process importing k2post): 0.5 s was under that on
    # a loaded 2-core box ("reward workers failed to start"), so give it 3 s against a 30 s setup
    with RewardPool(num_workers=1, timeout_s=TIMEOUT_S, setup_timeout_s=3.0) as small:
        reward = small.score(("toy_faulty", {"setup_delay_s": 30}, _task("toy_faulty"), "ok"))
    assert reward.error == "environment setup timed out after 3.0s"


def test_multi_turn_items_replay_turns_and_score_states(pool):
    task = _task("toy_counter", index=1)  # target 4
    add = {"role": "assistant", "tool_calls": [{"id": "functions.add:0", "name": "add", "arguments": {"n": 4}}]}
    replayed, single, state, wrong_kind = pool.score_batch(
        [
            ScoreItem("toy_counter", task, turns=[add, {"role": "assistant", "content": "done"}]),
            ScoreItem("toy_counter", task, response="no tools"),
            ScoreItem("toy_counter", task, state={"total": 4, "turns": 2}),
            ScoreItem("toy_echo", _task("toy_echo"), turns=[add]),
        ]
    )
    assert (replayed.value, single.value, state.value) == (1.0, -1.0, 1.0)
    assert wrong_kind.error == "TypeError: environment 'toy_echo' is single-turn: give a response, not turns"


def test_errors_use_the_reward_range_minimum(pool):
    task = _task("toy_counter")
    done_early = [{"role": "assistant", "content": "stop"}, {"role": "assistant", "content": "more"}]
    reward = pool.score(ScoreItem("toy_counter", task, turns=done_early))
    assert reward.value == -1.0 and "episode ended after turn 0" in reward.error


def test_unpicklable_item_is_an_error_not_a_crash(pool):
    reward = pool.score(ScoreItem("toy_counter", _task("toy_counter"), state={"fn": lambda: 1}))
    assert reward.error.startswith("score item does not pickle")


def test_direct_scorer_matches_pool(pool):
    task = _task("toy_boxed_sum")
    items = [("toy_boxed_sum", {}, task, r) for r in [f"\\boxed{{{task.answer}}}", "\\boxed{-1}", "none", "\\boxed{"]]
    direct = DirectScorer().score_batch(items)
    assert [r.value for r in direct] == [r.value for r in pool.score_batch(items)] == [1.0, 0.0, 0.0, 0.0]
    assert DirectScorer().score(("toy_faulty", {}, _task("toy_faulty"), "raise")).error == (
        f"ValueError: bad response {AT_RAISE}"
    )


def test_stats_and_close():
    small = RewardPool(num_workers=1, timeout_s=5)
    task = _task("toy_echo")
    small.score_batch([("toy_echo", {}, task, "x")] * 20)
    assert small.stats.scored == 20 and small.stats.scores_per_s > 0 and small.stats.workers == 1
    pids = small.worker_pids()
    small.close()
    small.close()
    assert all(not _alive(pid) for pid in pids)
    with pytest.raises(RewardPoolError, match="closed"):
        small.score_batch([("toy_echo", {}, task, "x")])


def test_bad_pool_arguments():
    with pytest.raises(ValueError, match="num_workers"):
        RewardPool(num_workers=0)
    with pytest.raises(ValueError, match="timeouts"):
        RewardPool(timeout_s=0)


def test_math_verify_scores_in_workers():
    # math-verify's first use in a fresh worker imports sympy (> 1 s on a loaded box): its own pool, a 20 s limit
    task = _task("math")
    with RewardPool(num_workers=1, timeout_s=20.0) as math_pool:
        rewards = math_pool.score_batch(
            [("math", {}, task, f"So \\boxed{{{task.answer}}}"), ("math", {}, task, "\\boxed{\\frac{1}{0}}")]
        )
    assert rewards[0].value == 1.0 and rewards[0].error is None
    assert rewards[1].value == 0.0 and rewards[1].error is None


def test_tool_call_messages_replay_from_typed_messages(pool):
    task = _task("toy_counter")  # target 3
    call = Message(role="assistant", tool_calls=[ToolCall(id="functions.add:0", name="add", arguments={"n": 3})])
    reward = pool.score(ScoreItem("toy_counter", task, turns=[call, Message(role="assistant", content="ok")]))
    assert reward.value == 1.0


@pytest.mark.slow
def test_throughput_benchmark_ends_with_json():
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[3] / "benchmarks" / "reward_throughput.py"
    proc = subprocess.run([sys.executable, str(script), "--quick"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"direct_scores_per_s", "pool_scores_per_s", "workers"} <= set(figures)
    assert figures["pool_scores_per_s"] > 0


def test_interrupted_batch_leaves_no_stale_results(pool, monkeypatch):
    task = _task("toy_faulty")
    original = pool._poll
    calls = {"n": 0}

    def interrupt_once(items, results):
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt
        return original(items, results)

    monkeypatch.setattr(pool, "_poll", interrupt_once)
    with pytest.raises(KeyboardInterrupt):
        pool.score_batch([("toy_faulty", {}, task, "raise")] * 2)
    rewards = pool.score_batch([("toy_faulty", {}, task, "ok")] * 3)
    assert [(r.value, r.error) for r in rewards] == [(1.0, None)] * 3


def test_an_env_defined_in_stdin_code_says_why_workers_cannot_import_it():
    """`python - < script` defines and registers an env in __main__ (no file): each reward says so in one line,
    instead of workers failing with tracebacks."""
    import subprocess
    import sys

    script = (
        "from k2post.envs import Environment, Reward, Task, register_environment\n"
        "from k2post.envs.workers import RewardPool\n"
        "@register_environment\n"
        "class Stdin(Environment):\n"
        "    name, task_type = 'from_stdin', 'toy'\n"
        "    def tasks(self, split='train', seed=0, n=None):\n"
        "        yield Task(id='t', env=self.name, task_type='toy', messages=[])\n"
        "    def score(self, task, response):\n"
        "        return Reward(value=1.0)\n"
        "with RewardPool(num_workers=1, timeout_s=30) as pool:\n"
        "    (reward,) = pool.score_batch([('from_stdin', {}, next(Stdin().tasks()), 'x')])\n"
        "print(reward.error)\n"
    )
    done = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "environment 'from_stdin' is defined in a script read from stdin or -c" in done.stdout
    assert "Traceback" not in done.stderr


def test_direct_scoring_is_bounded_in_time_in_the_main_thread():
    started = time.monotonic()
    reward = DirectScorer(timeout_s=0.5).score(("toy_faulty", {}, _task("toy_faulty"), "hang"))
    hang_line = TOY_LINES.index("            time.sleep(3600)") + 1  # where the scorer was stopped
    assert reward.error == f"ScoreTimeout: scoring took longer than 0.5 s (at {TOY_FILE}:{hang_line})"
    assert time.monotonic() - started < 5
    assert DirectScorer(timeout_s=0.5).score(("toy_faulty", {}, _task("toy_faulty"), "fine")).error is None


@pytest.mark.parametrize("where", ["pool", "direct"])
def test_a_plain_float_is_the_reward_with_a_breakdown_naming_the_scorer(pool, where):
    """verl's `compute_score` and TRL's reward functions return floats: such a scorer works unchanged."""
    scorer = pool if where == "pool" else DirectScorer()
    task = _task("toy_faulty")
    plain, integer = scorer.score_batch([("toy_faulty", {}, task, "float:0.25"), ("toy_faulty", {}, task, "float:1")])
    assert (plain.value, plain.breakdown, plain.error) == (0.25, {"ToyFaulty.score": 0.25}, None)
    assert (integer.value, integer.error) == (1.0, None)


@pytest.mark.parametrize("where", ["pool", "direct"])
@pytest.mark.parametrize(
    "response, at",
    [("raise", AT_RAISE), ("notreward", AT_DEF), ("value:2.0", AT_DEF)],
    ids=["raises", "returns-a-str", "out-of-range"],
)
def test_the_first_reward_error_line_names_the_scorers_file_line(pool, where, response, at):
    """The scorer's file:line: the last traceback frame in the env's own file, or (a bad return value) the line
    defining its `score`; it ends the error text and so the first line `describe_errors` prints."""
    from k2post.envs.reward_errors import describe_errors

    scorer = pool if where == "pool" else DirectScorer()
    (reward,) = scorer.score_batch([("toy_faulty", {}, _task("toy_faulty"), response)])
    assert reward.error.endswith(" " + at), reward.error
    (line,) = describe_errors(["toy_faulty"], [reward.error])
    assert line.startswith("toy_faulty: 1 of 1 rewards failed; first: ") and line.endswith(at)
