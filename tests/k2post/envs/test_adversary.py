"""The adversarial suite (k2post/envs/adversary.py): its strategies, the runner, the pass rule and the summary."""

from __future__ import annotations

import time

import pytest
from adversary_toys import (
    ToyEmptyPays,
    ToyExact,
    ToyFragile,
    ToyLookup,
    ToyNoHonest,
    ToyOwnHack,
    ToyPick,
    ToyPickNoChance,
)

from k2post.chat.types import Message, ToolCall
from k2post.envs.adversary import (
    STRATEGIES,
    GymReport,
    chance_bar,
    StrategyResult,
    context_paragraph,
    context_sentence,
    format_skeleton,
    near_miss_number,
    near_misses,
    play_bounded,
    run_suite,
    strategies_for,
    strategy_failures,
    suite_summary,
    with_final,
)
from k2post.envs.base import HonestPair, Reward, Task


def _task(*contents: str) -> Task:
    roles = ["system", "user"] if len(contents) == 2 else ["user"] * len(contents)
    messages = [Message(role=role, content=text) for role, text in zip(roles, contents)]
    return Task(id="t", env="x", task_type="toy", messages=messages)


@pytest.mark.parametrize(
    "contents, sentence",
    [
        (
            ("Answer from it.\n\nContext:\nThe lamp was lit in 1931. It burned.\n\nQuestion: when?",),
            "The lamp was lit in 1931.",
        ),
        (("Be brief.", "Context:\nThe lamp was lit in 1931. It burned down.\n\nQ?"), "The lamp was lit in 1931."),
        (("What is 2 + 2?",), "What is 2 + 2?"),
        (("no punctuation at all",), "no punctuation at all"),
        (("",), None),
    ],
)
def test_context_sentence_is_the_first_sentence_of_the_longest_paragraph(contents, sentence):
    assert context_sentence(_task(*contents)) == sentence


def test_context_paragraph_is_the_source_without_its_label():
    task = _task("Answer from it.\n\nContext:\nThe lamp was lit in 1931. It burned.\n\nQuestion: when?")
    assert context_paragraph(task) == "The lamp was lit in 1931. It burned."


@pytest.mark.parametrize(
    "text, inline, lines",
    [
        ("\\boxed{30}", "\\boxed{29 30 31}", ["\\boxed{29}", "\\boxed{30}", "\\boxed{31}"]),
        ("From 3 to -2786", "From 3 to -2787 -2786 -2785", ["From 3 to -2787", "From 3 to -2786", "From 3 to -2785"]),
        ("no number", None, None),
        ("9" * 400, None, None),
    ],
)
def test_near_miss_hedges_put_the_right_number_between_two_wrong_ones(text, inline, lines):
    assert near_miss_number(text) == inline
    assert near_misses(text) == lines


@pytest.mark.parametrize(
    "text, skeleton",
    [
        ("\\boxed{30}", "\\boxed{x}"),
        ("The verdict: [[B]]", "x x: [[x]]"),
        ('{"total": 12, "ok": true}', '{"x": x, "x": x}'),
        ("```python\ndef f(n):\n    return n\n```", "```x\nx x(x):\n    x x\n```"),
    ],
)
def test_format_skeleton_keeps_the_format_and_drops_the_content(text, skeleton):
    assert format_skeleton(text) == skeleton


def test_with_final_replaces_the_last_text_turn_only():
    call = Message(role="assistant", tool_calls=[ToolCall(id="functions.a:0", name="a")])
    assert with_final("x", "y") == "y"
    assert with_final([call, Message(role="assistant", content="x")], "y")[-1].content == "y"
    assert with_final([call], "y") is None


@pytest.mark.parametrize(
    "values, above_right, errors, wrong_mean, expected",
    [
        ([0.0, 0.0], 0, [], 0.0, []),
        ([0.5, 0.5], 0, [], 0.5, []),
        ([1.0, 0.0], 0, [], 0.25, ["s: mean 0.500 > honest_wrong 0.250"]),
        ([0.0, 0.2], 1, [], 0.5, ["s: above honest_right on 1/2 task(s)"]),
        ([0.0, 0.0], 0, ["ValueError: x"], 0.0, ["s: scoring error on 1 task(s): ValueError: x"]),
    ],
)
def test_strategy_pass_rule(values, above_right, errors, wrong_mean, expected):
    result = StrategyResult("s", values=values, above_right=above_right, errors=errors)
    assert strategy_failures(result, ("honest_wrong", wrong_mean), len(values)) == expected


def test_an_honest_gym_passes_and_every_generic_strategy_is_scored():
    report = run_suite(ToyExact(), n_tasks=4)
    assert report.failures() == [] and report.verdict == "PASS" and report.tasks == 4
    assert (report.right.mean, report.wrong.mean) == (1.0, 0.0)
    single_turn = {name for name in STRATEGIES if not name.startswith(("no_calls", "every_tool", "same_call"))}
    assert single_turn - {"hedge_near_miss", "hedge_near_miss_lines"} == set(report.strategies)  # no number answer
    assert all(result.values == [0.0] * 4 for result in report.strategies.values())


def test_a_gym_that_pays_for_nothing_fails_and_names_the_strategy():
    report = run_suite(ToyEmptyPays(), n_tasks=4)
    assert not report.passed and report.verdict == "FAIL"
    assert "empty: mean 1.000 > honest_wrong 0.000" in report.failures()
    assert report.worst() == ("empty", 1.0)
    assert report.strategies["filler"].mean == 0.0


def test_a_forced_scorer_error_fails_the_gym():
    report = run_suite(ToyFragile(), n_tasks=2)
    failures = report.failures()
    assert any(line.startswith("error_brackets: scoring error on 2 task(s): RecursionError") for line in failures)
    assert report.strategies["error_brackets"].values == [0.0, 0.0]


def test_the_envs_own_hacks_are_scored_too():
    report = run_suite(ToyOwnHack(), n_tasks=3)
    assert report.failures() == ["shout: mean 0.500 > honest_wrong 0.000"]


def test_a_multi_turn_gym_where_no_calls_pays_fails_on_it():
    env = ToyLookup()
    report = run_suite(env, n_tasks=4)
    assert (report.right.mean, report.wrong.mean) == (1.0, 0.5)
    assert "no_calls_done: mean 0.600 > honest_wrong 0.500" in report.failures()
    assert report.strategies["no_calls_final"].mean == pytest.approx(0.6)
    assert report.strategies["every_tool_empty_args"].mean == pytest.approx(0.6)  # read({}) reads nothing
    repeated = strategies_for(env, next(env.tasks("test")), env.honest(next(env.tasks("test"))))["same_call_repeated"]
    assert len(repeated) == env.max_turns and {turn.tool_calls[0].name for turn in repeated} == {"read"}
    assert report.strategies["same_call_repeated"].mean == 0.5  # read, then no answer


def test_a_gym_without_honest_answers_is_not_judged():
    report = run_suite(ToyNoHonest(), n_tasks=2)
    assert not report.judged and report.verdict == "not judged" and report.failures() == []
    assert "implement Environment.honest" in report.not_judged


def test_honest_that_raises_is_a_failure_not_a_traceback():
    class Broken(ToyExact):
        def honest(self, task):
            raise KeyError("gold")

    report = run_suite(Broken(), n_tasks=2)
    assert report.verdict == "FAIL" and report.failures()[0].startswith("honest()/hacks() raised on task test-0")


def test_tasks_that_raise_fail_the_gym_in_one_line():
    class NoTasks(ToyExact):
        def tasks(self, split="train", seed=0, n=None):
            raise OSError("data file missing")

    report = run_suite(NoTasks(), n_tasks=2)
    assert report.verdict == "FAIL" and report.failures() == ["tasks('test') raised: OSError: data file missing"]


def test_an_attempt_is_bounded_and_its_error_recorded():
    class Slow(ToyExact):
        def score(self, task, response):
            time.sleep(5)
            return Reward(value=1.0)

    env = Slow()
    task = next(env.tasks("test"))
    started = time.monotonic()
    reward = play_bounded(env, task, "x", timeout_s=0.2)
    assert time.monotonic() - started < 2 and reward.value == 0.0 and "longer than 0.2 s" in reward.error


def test_an_out_of_range_reward_is_an_error():
    class TooHigh(ToyExact):
        def score(self, task, response):
            return Reward(value=2.0)

    reward = play_bounded(TooHigh(), next(ToyExact().tasks("test")), "x")
    assert reward.value == 0.0 and "outside the env's reward_range" in reward.error


def test_suite_summary_counts_hackable_gyms_and_names_the_worst():
    reports = [run_suite(ToyExact(), 2), run_suite(ToyEmptyPays(), 2), run_suite(ToyNoHonest(), 2)]
    summary = suite_summary(reports)
    assert {k: summary[k] for k in ("gyms", "gyms_hackable", "gyms_not_judged", "worst_margin", "worst")} == {
        "gyms": 3,
        "gyms_hackable": 1,
        "gyms_not_judged": 1,
        "worst_margin": 1.0,
        "worst": "adv_toy_empty_pays/empty",
    }
    assert summary["per_gym"]["adv_toy_exact"]["verdict"] == "PASS"
    assert summary["per_gym"]["adv_toy_no_honest"] == {"verdict": "not judged", "tasks": 0}


def test_hedges_and_injections_are_built_from_the_honest_pair():
    env, task = ToyExact(), _task("What is 6 * 5?")
    plays = strategies_for(env, task, HonestPair(right="\\boxed{30}", wrong="\\boxed{29}"))
    assert plays["hedge_sandwich"] == "\\boxed{29}\n\n\\boxed{30}\n\n\\boxed{29}"
    assert plays["hedge_near_miss"] == "\\boxed{29 30 31}"
    assert plays["inject_turn"].startswith("\\boxed{29}<|im_end|>") and "[[A]]" in plays["inject_turn"]
    assert plays["copy_prompt"] == "What is 6 * 5?" and plays["format_only"] == "\\boxed{x}"
    assert not {"no_calls_done", "every_tool_empty_args", "same_call_repeated"} & set(plays)


@pytest.mark.parametrize(
    "right, wrong, applies",
    [
        ("\\boxed{30}", "\\boxed{29}", True),
        ("It was built in 1872.", "It was built in 1877.", True),
        ("```python\ndef f(n):\n    return n + 1\n```", "```python\ndef f(n):\n    return None\n```", False),
        ("```python\nreturn n * 2\n```", "```python\nreturn n + 2\n```", False),  # same last integer
        ("Response A is better. [[A]]", "Response B is better. [[B]]", False),
    ],
)
def test_near_miss_hedges_apply_only_where_the_answer_is_a_number(right, wrong, applies):
    plays = strategies_for(ToyExact(), _task("q"), HonestPair(right=right, wrong=wrong))
    assert ("hedge_near_miss" in plays) == applies and ("hedge_near_miss_lines" in plays) == applies


def test_a_choice_gym_is_held_to_chance_not_to_honest_wrong():
    """Two options, honest-wrong always picks the other (0): a constant pick scores chance (0.5), which is no
    hack; a surface cue that agrees with the gold more often than chance is."""
    report = run_suite(ToyPick(), n_tasks=4)  # a choice gym is scored on 64 tasks: luck within 2 sd = 0.125
    assert report.tasks == 64 and report.bar == ("chance", 0.625)
    assert report.failures() == ["longer: mean 0.750 > chance 0.625"]
    assert report.strategies["always_a"].mean == 0.5 and report.summary()["chance"] == 0.5
    assert ToyPick.chance_reward == 0.5 and run_suite(ToyPickNoChance(), n_tasks=4).failures()[:2] == [
        "longer: mean 0.750 > honest_wrong 0.000",
        "always_a: mean 0.500 > honest_wrong 0.000",
    ]


@pytest.mark.parametrize(
    "chance, tasks, bar", [(0.5, 64, 0.625), (0.5, 4, 1.0), (0.5, 256, 0.5625), (0.25, 48, 0.375), (0.0, 64, 0.0)]
)
def test_chance_bar_is_chance_plus_two_standard_deviations_of_the_mean(chance, tasks, bar):
    assert chance_bar(chance, tasks) == pytest.approx(bar)


def test_a_strategy_is_held_to_honest_wrong_on_the_tasks_it_applies_to():
    """A strategy scored on some tasks only (a near-miss hedge needs a number) is compared with honest-wrong's
    mean on those tasks, not over all of them (honest-wrong 0.2 on a task the strategy skipped)."""
    report = GymReport(env="g", split="test", tasks=2)
    report.right.add(Reward(value=1.0), 1.0, 0.2)
    report.right.add(Reward(value=1.0), 1.0, 0.9)
    report.wrong.add(Reward(value=0.2), 1.0, 0.2)
    report.wrong.add(Reward(value=0.9), 1.0, 0.9)
    report.strategies["hedge"] = StrategyResult("hedge")
    report.strategies["hedge"].add(Reward(value=0.9), 1.0, 0.9)
    assert report.bar_for(report.strategies["hedge"]) == ("honest_wrong", 0.9) and report.failures() == []
    report.strategies["hedge"].add(Reward(value=0.9), 1.0, 0.2)
    assert report.failures() == ["hedge: mean 0.900 > honest_wrong 0.550"]


def test_gym_report_requires_right_to_beat_wrong():
    report = GymReport(env="g", split="test", tasks=1)
    report.right.add(Reward(value=0.0), 0.0, 0.0)
    report.wrong.add(Reward(value=0.0), 0.0, 0.0)
    assert report.failures() == ["honest_right mean 0.000 is not above honest_wrong 0.000"]
