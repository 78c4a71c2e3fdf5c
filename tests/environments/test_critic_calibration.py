"""critic_calibration gym: verifier-checked reference pairs, pairs files, agreement scoring, baselines."""

from __future__ import annotations

import pytest

from k2post.config.loader import ConfigError, validate_config
from k2post.envs.mix import EnvEntryConfig
from k2post.envs.registry import make_environment
from k2post.judging.calibration import CalibrationPair

CHAIN_SUM = {
    "dataset": "chain_sum",
    "dataset_config": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1},
}
SOURCES = [{"name": "math", "config": {"difficulty": 1}}, {"name": "reasoning_gym", "config": CHAIN_SUM}]


@pytest.fixture(scope="module")
def env():
    return make_environment("critic_calibration", {"sources": SOURCES})


def _gold_text(task, position: str) -> str:
    text = task.messages[-1].content
    tag = "response_a" if position == "A" else "response_b"
    return text.split(f"<{tag}>")[1].split(f"</{tag}>")[0].strip()


@pytest.mark.parametrize("split", ["train", "test"])
def test_reference_pairs_are_verified_and_alternate_sources(env, split):
    tasks = list(env.tasks(split, seed=0, n=20))
    assert len(tasks) == 20 and {t.metadata["source_env"] for t in tasks} == {"math", "reasoning_gym"}
    for task in tasks:
        source = env.source_envs[task.metadata["source_env"]]
        src_task = next(t for t in source.tasks(split, seed=0, n=20) if t.id == task.metadata["source_task_id"])
        other = "B" if task.answer == "A" else "A"
        assert (
            source.score(src_task, _gold_text(task, task.answer)).value
            >= 0.5
            > source.score(src_task, _gold_text(task, other)).value
        )


def test_splits_are_disjoint_and_seeded(env):
    test_ids = {t.metadata["source_task_id"] for t in env.tasks("test", seed=0, n=30)}
    train = list(env.tasks("train", seed=0, n=30))
    assert not test_ids & {t.metadata["source_task_id"] for t in train}
    assert [t.id for t in train] == [t.id for t in env.tasks("train", seed=0, n=30)]


def test_constant_judge_agrees_half_the_time_and_the_verifier_always(env):
    tasks = list(env.tasks("test", seed=0, n=100))
    always_a = sum(env.score(t, "[[A]]").value for t in tasks) / len(tasks)
    oracle = sum(env.score(t, f"[[{t.answer}]]").value for t in tasks) / len(tasks)
    assert 0.35 < always_a < 0.65 and oracle == 1.0
    assert all(env.score(t, junk).value == 0.0 for t in tasks[:5] for junk in ("", "[[TIE]]", "maybe", "A and B"))


def test_pairs_files_round_trip_and_bad_lines_name_the_line(tmp_path):
    from k2post_environments.critic_calibration import load_pairs, write_pairs

    pairs = [
        CalibrationPair(
            source_env="math",
            source_task_id=f"t{i}",
            prompt=[{"role": "user", "content": f"{i}+1?"}],
            correct=f"{i + 1}",
            wrong=f"{i + 2}",
        )
        for i in range(5)
    ]
    path = tmp_path / "heldout.jsonl"
    write_pairs(path, pairs)
    assert list(load_pairs(str(path))) == pairs
    env = make_environment("critic_calibration", {"heldout_pairs_path": str(path)})
    tasks = list(env.tasks("test"))
    assert len(tasks) == 5 and {t.metadata["source_task_id"] for t in tasks} == {f"t{i}" for i in range(5)}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(path.read_text().splitlines()[0] + "\n" + '{"source_env": "math"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: source_task_id: Field required"):
        list(make_environment("critic_calibration", {"heldout_pairs_path": str(bad)}).tasks("test"))


def test_multi_turn_sources_are_refused_in_one_line():
    with pytest.raises(ConfigError, match="multi-turn") as err:
        validate_config(
            EnvEntryConfig, {"name": "critic_calibration", "config": {"sources": [{"name": "tool_use"}]}}, "rl.yaml"
        )
    assert "\n" not in str(err.value)


def test_a_task_without_gold_position_is_an_error_reward(env):
    task = next(env.tasks("test", n=1)).model_copy(update={"answer": None})
    reward = env.score(task, "[[A]]")
    assert reward.value == 0.0 and "no gold position" in reward.error


MATH = {"difficulty": 1, "problem_types": ["add", "sub", "mul", "word"]}


@pytest.fixture(scope="module")
def malformed_env():
    return make_environment(
        "critic_calibration",
        {
            "sources": [{"name": "math", "config": MATH}],
            "pair_kind": "malformed",
            "prompt_style": "compact",
            "answer_template": "The answer is {answer}.",
        },
    )


def test_malformed_pairs_fail_the_verifier_and_the_correct_one_passes(malformed_env):
    from k2post.judging.calibration import MALFORMED_REPLIES

    source = malformed_env.source_envs["math"]
    src = {t.id: t for t in source.tasks("test", seed=0, n=40)}
    tasks = list(malformed_env.tasks("test", seed=0, n=40))
    assert len(tasks) == 40
    wrongs = set()
    for task in tasks:
        other = "B" if task.answer == "A" else "A"
        correct, wrong = _gold_text(task, task.answer), _gold_text(task, other)
        src_task = src[task.metadata["source_task_id"]]
        assert correct == f"The answer is {src_task.answer}." and source.score(src_task, correct).value == 1.0
        verdict = source.score(src_task, wrong)
        assert verdict.value == 0.0 and not any(
            ch.isdigit() for ch in verdict.info["extracted"] or ""
        )  # no answer read
        wrongs.add(wrong)
    assert len(wrongs) == len(MALFORMED_REPLIES)  # every malformation of the table is drawn


def test_malformed_pairs_keep_the_seeded_coin(malformed_env):
    answers = [t.answer for t in malformed_env.tasks("test", seed=0, n=100)]
    assert answers == [t.answer for t in malformed_env.tasks("test", seed=0, n=100)]
    assert 35 < answers.count("A") < 65
    moved = make_environment("critic_calibration", {**malformed_env.config.model_dump(), "placement_seed": 1})
    assert [t.answer for t in moved.tasks("test", seed=0, n=100)] != answers


def test_compact_prompt_is_short_and_one_message(malformed_env, env):
    from k2post.judging.prompts import COMPACT_INSTRUCTION

    task = next(malformed_env.tasks("test", seed=0, n=1))
    assert [m.role for m in task.messages] == ["user"] and task.messages[0].content.endswith(COMPACT_INSTRUCTION)
    assert "Judge by: Correct final answer." in task.messages[0].content
    full = next(env.tasks("test", seed=0, n=1))
    compact_chars = max(len(t.messages[0].content) for t in malformed_env.tasks("test", seed=0, n=50))
    assert compact_chars < 420 and compact_chars * 2 < sum(len(m.content) for m in full.messages)


def test_default_pair_kind_is_unchanged(env):
    assert env.config.pair_kind == "reference" and env.config.prompt_style == "full"
    task = next(env.tasks("test", seed=0, n=1))
    assert [m.role for m in task.messages] == ["system", "user"]


# --- issue 43: pairs no surface cue tells apart; hedged verdicts ------------------------------------------------------

import random  # noqa: E402
import statistics  # noqa: E402
from pathlib import Path  # noqa: E402

import yaml  # noqa: E402
from cheap_strategies import means, strategy_table  # noqa: E402

from k2post.judging.calibration import hedged_verdict, matched_wrong_answer  # noqa: E402

DEMO = Path(__file__).resolve().parents[2] / "configs" / "rl_demo.yaml"


@pytest.fixture(scope="module")
def demo_env():
    entry = next(e for e in yaml.safe_load(DEMO.read_text())["envs"] if e["name"] == "critic_calibration")
    return make_environment("critic_calibration", entry["config"])


@pytest.mark.parametrize("split", ["train", "test"])
def test_the_demo_pairs_have_no_surface_cue(demo_env, split):
    from k2post_environments.critic_calibration import best_surface_baseline

    name, value = best_surface_baseline(demo_env.tasks(split, seed=0, n=200))
    assert value <= 0.6, f"{name} agrees {value:.3f} on the demo's {split} pairs"


def test_malformed_pairs_are_told_apart_by_digits_and_the_baseline_says_so(malformed_env):
    from k2post_environments.critic_calibration import best_surface_baseline

    assert best_surface_baseline(malformed_env.tasks("test", seed=0, n=40)) == ("more_digits", 1.0)


@pytest.mark.parametrize("gold", ["0", "1", "7", "9", "10", "11", "42", "98", "99", "-3", "-10", "1234", "100000"])
def test_matched_wrong_answer_looks_like_the_gold_one(gold):
    for seed in range(20):
        wrong = matched_wrong_answer(gold, random.Random(seed))
        assert wrong != gold and int(wrong) % 2 == int(gold) % 2
        assert len(wrong.lstrip("-")) == len(gold.lstrip("-")) and wrong.startswith("-") == gold.startswith("-")


def test_matched_wrong_answer_is_above_or_below_by_a_coin():
    above = [int(matched_wrong_answer("50", random.Random(seed))) > 50 for seed in range(400)]
    assert 0.4 < sum(above) / len(above) < 0.6


@pytest.mark.parametrize(
    "text,hedged",
    [
        ("[[A]]\n[[B]]", True),
        ("[[b]] and later [[A]]", True),
        ("Response B is better.\nWinner: A", True),
        ("[[A]]" + "\nzz" * 200 + "\n[[B]]", True),
        ("7 + 5 = 12. A: 14, B: 12. [[B]]", False),
        ("A: 14, B: 12.\n[[B]]", False),
        ("[[A]] [[A]]", False),
        ("<think>[[A]]</think>[[B]]", False),  # only the answer after the reasoning is read
    ],
)
def test_hedged_verdicts(text, hedged):
    assert hedged_verdict(text) is hedged


def test_cheap_judges_stay_at_chance_and_junk_earns_nothing(demo_env):
    tasks = list(demo_env.tasks("test", seed=0, n=64))
    table = strategy_table(demo_env, tasks)
    surface = {name for name in table if name.startswith(("more_", "less_", "always_"))}
    got = means(table)
    assert got["honest_right"] == 1.0 and got["honest_wrong"] == 0.0
    assert all(value == 0.0 for name, value in got.items() if name not in surface | {"honest_right"}), got
    assert max(got[name] for name in surface) <= 0.65, got  # a two-way judge's bar: chance (64 pairs: +-0.06)
    chance = statistics.fmean(table["always_a"] + table["always_b"])
    assert chance == 0.5


def test_eval_reports_the_best_single_feature_judge(demo_env, malformed_env):
    from k2post.evaluation.heldout import best_baseline

    demo = [demo_env.score(t, "[[A]]") for t in demo_env.tasks("test", seed=0, n=100)]
    malformed = [malformed_env.score(t, "[[A]]") for t in malformed_env.tasks("test", seed=0, n=20)]
    assert best_baseline(demo)["baseline_best"] <= 0.6 and best_baseline(malformed) == {"baseline_best": 1.0}
    assert best_baseline([]) == {}
