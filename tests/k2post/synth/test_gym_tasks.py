"""SFT rows from verifiable gyms: reference answers judged by the gym's own verifier, mixed with tool-use rows."""

from __future__ import annotations

import random

import pytest
from datasets import load_from_disk

from k2post.config.loader import ConfigError, validate_config
from k2post.synth.config import SynthConfig
from k2post.synth.gym_tasks import GymTasksConfig, gym_row, gym_tasks, question_numbers, wrong_answer
from k2post.synth.pipeline import read_shards, run_synth

CHAIN_SUM = {
    "dataset": "chain_sum",
    "dataset_config": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1},
}


@pytest.mark.parametrize("answer", ["0", "7", "-13", "120"])
def test_wrong_answer_of_a_number_is_a_different_number(answer):
    for seed in range(20):
        wrong = wrong_answer(answer, random.Random(seed))
        assert int(wrong) != int(answer) and abs(int(wrong) - int(answer)) <= 2


@pytest.mark.parametrize("answer", ["abc", "aba", "x", "Friday"])
def test_wrong_answer_of_text_differs(answer):
    assert wrong_answer(answer, random.Random(0)) != answer


@pytest.mark.parametrize("env,config", [("math", {"difficulty": 1}), ("reasoning_gym", CHAIN_SUM)])
def test_reference_rows_pass_the_verifier_and_mistakes_are_rejected(env, config):
    cfg = GymTasksConfig(env=env, config=config, tasks=40)
    environment, tasks = gym_tasks(cfg, seed=3)
    assert tasks and all(t.answer is not None for t in tasks)
    clean = [gym_row(cfg, environment, t, 3, mistake_rate=0.0) for t in tasks]
    assert all(r["accepted"] and r["metadata"]["mistake"] is None for r in clean)
    assert all(
        r["messages"][-1] == {"role": "assistant", "content": f"\\boxed{{{t.answer}}}"} for r, t in zip(clean, tasks)
    )
    spoiled = [gym_row(cfg, environment, t, 3, mistake_rate=1.0) for t in tasks]
    assert all(not r["accepted"] and r["metadata"]["mistake"] == "wrong_answer" for r in spoiled)
    assert all(r["verdict"]["reasons"][0].startswith("verifier: reward") for r in spoiled)


def test_answer_styles_follow_their_weights_and_the_verifier_decides():
    styles = {"The answer is {answer}.": 3.0, "\\boxed{{{answer}}}": 1.0}
    math = GymTasksConfig(env="math", config={"difficulty": 1}, tasks=400, answer_templates=styles)
    env, tasks = gym_tasks(math, seed=0)
    rows = [gym_row(math, env, t, 0, mistake_rate=0.0) for t in tasks]
    share = sum(r["metadata"]["template"].startswith("The answer") for r in rows) / len(rows)
    assert 0.68 < share < 0.82 and all(r["accepted"] for r in rows)  # math reads "the answer is"
    rg = GymTasksConfig(env="reasoning_gym", config=CHAIN_SUM, tasks=60, answer_templates=styles)
    env, tasks = gym_tasks(rg, seed=0)
    rows = [gym_row(rg, env, t, 0, mistake_rate=0.0) for t in tasks]
    assert all(
        r["accepted"] == r["metadata"]["template"].startswith("\\boxed") for r in rows
    )  # its last line must be the answer


def test_numbers_slot_restates_the_question_and_the_verifier_still_reads_the_answer():
    cfg = GymTasksConfig(
        env="math",
        config={"difficulty": 1, "problem_types": ["add", "sub", "mul"]},
        tasks=50,
        answer_templates={"{numbers}: the answer is {answer}.": 1.0},
    )
    env, tasks = gym_tasks(cfg, seed=0)
    for task in tasks:
        row = gym_row(cfg, env, task, 0, mistake_rate=0.0)
        question = task.messages[-1].content  # "What is 12 + 7?"
        operands = (
            question.removeprefix("What is ")
            .removesuffix("?")
            .replace(" * ", ", ")
            .replace(" + ", ", ")
            .replace(" - ", ", ")
        )
        assert row["messages"][-1]["content"] == f"{operands}: the answer is {task.answer}." and row["accepted"]


def test_judge_rows_fill_the_numbers_slot_too():
    cfg = GymTasksConfig(
        env="math",
        config={"difficulty": 1},
        tasks=20,
        judge_share=1.0,
        answer_templates={"{numbers}: the answer is {answer}.": 1.0},
    )
    env, tasks = gym_tasks(cfg, seed=0)
    rows = [gym_row(cfg, env, t, 0, mistake_rate=0.0) for t in tasks]
    assert all(r["metadata"]["template"] == "judge" and r["accepted"] for r in rows)
    assert tasks and all(question_numbers(t) for t in tasks)
    assert all(f"{question_numbers(t)}: the answer is" in r["messages"][-2]["content"] for r, t in zip(rows, tasks))


def test_gym_tasks_draw_apart_from_the_rl_pool_seed():
    cfg = GymTasksConfig(env="math", config={"difficulty": 2}, tasks=30)
    _, synth = gym_tasks(cfg, seed=0)
    rl_pool = list(cfg.make_env().tasks("train", seed=0, n=30))
    assert {t.messages[0].content for t in synth} != {t.messages[0].content for t in rl_pool}


@pytest.mark.parametrize(
    "raw,needle",
    [
        ({"env": "tool_use"}, "is multi-turn"),
        ({"env": "math", "config": {"difficulty": 9}}, "difficulty"),
        ({"env": "nope"}, "nope"),
        ({"env": "math", "answer_templates": {"{answer}": 0.0}}, "positive weight"),
        ({"env": "math", "answer_templates": {"{question} {answer}": 1.0}}, "unknown slot(s) ['question']"),
    ],
)
def test_bad_gym_entries_are_one_line_errors(raw, needle):
    with pytest.raises(ConfigError) as err:
        validate_config(SynthConfig, {"domains": [], "gym_tasks": [raw]}, "synth.yaml")
    assert needle in str(err.value) and "gym_tasks.0" in str(err.value) and "\n" not in str(err.value)


def test_nothing_to_synthesize_is_an_error():
    with pytest.raises(ConfigError, match="nothing to synthesize"):
        validate_config(SynthConfig, {"domains": []}, "synth.yaml")


def test_run_mixes_tool_use_and_gym_rows_and_resumes(tmp_path):
    raw = {
        "out_dir": str(tmp_path / "out"),
        "domains": ["bank"],
        "tasks_per_domain": 4,
        "heldout_tasks_per_domain": 1,
        "mistake_rate": 0.3,
        "seed": 1,
        "gym_tasks": [
            {"env": "math", "config": {"difficulty": 1}, "tasks": 25},
            {"env": "reasoning_gym", "config": CHAIN_SUM, "tasks": 15},
        ],
    }
    stats = run_synth(SynthConfig(**raw))
    rows = [dict(r) for r in load_from_disk(str(tmp_path / "out" / "dataset"))]
    domains = {r["domain"] for r in rows}
    assert domains == {"bank", "gym:math", "gym:reasoning_gym"}
    assert stats["per_domain"]["gym:math"]["accepted"] + stats["per_domain"]["gym:math"]["rejected"] == 25
    assert stats["mistakes_injected"].get("wrong_answer", 0) >= 1
    assert stats["mistakes_rejected"]["wrong_answer"] >= sum(
        1
        for r in read_shards(tmp_path / "out" / "shards")
        if r["domain"].startswith("gym:") and r["metadata"]["mistake"]
    )
    shard_rows = len(read_shards(tmp_path / "out" / "shards"))
    again = run_synth(SynthConfig(**raw))  # resume: every task is decided, nothing is written twice
    assert again == stats and len(read_shards(tmp_path / "out" / "shards")) == shard_rows


def test_judge_rows_carry_the_verifiers_verdict_and_wrong_verdicts_are_rejected():
    from k2post.judging.verdict import parse_verdict

    cfg = GymTasksConfig(env="math", config={"difficulty": 1}, tasks=120, judge_share=0.5)
    env, tasks = gym_tasks(cfg, seed=2)
    rows = [gym_row(cfg, env, t, 2, mistake_rate=0.2) for t in tasks]
    judges = [r for r in rows if r["domain"] == "critic:math"]
    assert 35 < len(judges) < 85 and all(r["metadata"]["task_type"] == "critic" for r in judges)
    for row in judges:
        verdict = parse_verdict(row["messages"][-1]["content"]).winner
        assert row["accepted"] == (verdict == row["metadata"]["gold_position"]) == (row["metadata"]["mistake"] is None)
        assert "<response_a>" in row["messages"][-2]["content"] and row["messages"][0]["role"] == "system"
    assert any(r["metadata"]["mistake"] == "wrong_verdict" for r in judges)


def test_steps_slot_writes_the_worked_solution_and_the_verifier_reads_the_answer():
    styles = {"\\boxed{{{answer}}}": 1.0, "{steps}. \\boxed{{{answer}}}": 1.0}
    for env_name, config in (
        ("math", {"difficulty": 1, "problem_types": ["add", "sub", "mul", "word"]}),
        ("reasoning_gym", CHAIN_SUM),
    ):
        cfg = GymTasksConfig(env=env_name, config=config, tasks=60, answer_templates=styles)
        env, tasks = gym_tasks(cfg, seed=0)
        rows = [gym_row(cfg, env, t, 0, mistake_rate=0.0) for t in tasks]
        worked = [(r, t) for r, t in zip(rows, tasks) if r["metadata"]["template"].startswith("{steps}")]
        assert 15 < len(worked) < 45 and all(r["accepted"] for r in rows)
        for row, task in worked:
            reply = row["messages"][-1]["content"]
            assert reply == f"{env.worked_solution(task)}. \\boxed{{{task.answer}}}" and f"= {task.answer}." in reply


def test_steps_slot_on_an_env_without_worked_solutions_is_an_error():
    cfg = GymTasksConfig(
        env="reasoning_gym", config={"dataset": "spell_backward"}, tasks=3, answer_templates={"{steps}. {answer}": 1.0}
    )
    env, tasks = gym_tasks(cfg, seed=0)
    with pytest.raises(ValueError, match=r"has a \{steps\} slot but 'reasoning_gym' writes no worked solution"):
        gym_row(cfg, env, tasks[0], 0, mistake_rate=0.0)


def test_critic_rows_judge_by_working_it_out():
    cfg = GymTasksConfig(
        env="critic_calibration",
        tasks=40,
        config={
            "prompt_style": "compact",
            "sources": [{"name": "math", "config": {"difficulty": 1, "problem_types": ["add", "sub", "mul", "word"]}}],
        },
        answer_templates={"[[{answer}]]": 1.0, "{steps}. [[{answer}]]": 1.0},
    )
    env, tasks = gym_tasks(cfg, seed=0)
    rows = [gym_row(cfg, env, t, 0, mistake_rate=0.0) for t in tasks]
    assert all(r["accepted"] for r in rows)
    worked = [r["messages"][-1]["content"] for r in rows if r["metadata"]["template"].startswith("{steps}")]
    assert worked and all(". A: " in reply and reply.endswith("]]") for reply in worked)


def test_a_fixed_reply_is_kept_only_where_the_verifier_agrees_unless_accept_at_is_lowered():
    config = {"prompt_style": "compact", "pair_kind": "malformed"}
    strict = GymTasksConfig(env="critic_calibration", config=config, tasks=40, answer_templates={"[[A]]": 1.0})
    env, tasks = gym_tasks(strict, seed=0)
    rows = [gym_row(strict, env, t, 0, mistake_rate=0.0) for t in tasks]
    assert [r["accepted"] for r in rows] == [t.answer == "A" for t in tasks] and 0 < sum(
        r["accepted"] for r in rows
    ) < 40
    lenient = strict.model_copy(update={"accept_at": 0.0})
    rows = [gym_row(lenient, env, t, 0, mistake_rate=0.0) for t in tasks]
    assert all(
        r["accepted"] and r["messages"][-1]["content"] == "[[A]]" for r in rows
    )  # a position-biased teacher, unverified
