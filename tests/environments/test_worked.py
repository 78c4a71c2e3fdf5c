"""Worked solutions: chain steps of integer expressions, and the envs' `worked_solution` reaching the gold answer."""

from __future__ import annotations

import pytest

import k2post_environments  # noqa: F401  (registers the gyms)
from k2post_environments.worked import chain_steps, chain_value, expression_of
from k2post.envs.base import Task
from k2post.envs.registry import make_environment


@pytest.mark.parametrize(
    "expression,steps",
    [
        ("7 - 3 + 9", "7 - 3 = 4, 4 + 9 = 13"),
        ("0 - 4 - 8", "0 - 4 = -4, -4 - 8 = -12"),
        ("12 * 3", "12 * 3 = 36"),
        ("5 + 8 + 0 + 7", "5 + 8 = 13, 13 + 0 = 13, 13 + 7 = 20"),
        ("-3 + 2", "-3 + 2 = -1"),
    ],
)
def test_chain_steps_left_to_right(expression, steps):
    assert chain_steps(expression) == steps
    assert chain_value(expression) == int(steps.rsplit("= ", 1)[1])


@pytest.mark.parametrize("junk", ["", "7", "7 +", "7 + x", "2 * 3 + 1", "1 ++ 2", "3 / 4"])
def test_chain_steps_refuse_what_is_not_a_chain(junk):
    with pytest.raises(ValueError):
        chain_steps(junk)


@pytest.mark.parametrize(
    "question,expression",
    [
        ("State the final answer to the following arithmetic problem: 0 - 4 - 8 =", "0 - 4 - 8"),
        ("What is 17 + 25?", "17 + 25"),
        (
            "line one\nState the final answer to the following arithmetic problem: 3 + 4 =\n\n"
            "Put your answer in a box.",
            "3 + 4",
        ),
        ("How many apples?", None),
    ],
)
def test_expression_of_a_question(question, expression):
    assert expression_of(question) == expression


@pytest.mark.parametrize("difficulty", [1, 2, 3])
@pytest.mark.parametrize("split", ["train", "test", "shifted"])
def test_math_worked_solution_reaches_the_gold_answer_with_or_without_metadata(difficulty, split):
    env = make_environment("math", {"difficulty": difficulty})
    for task in env.tasks(split, seed=0, n=150):
        bare = Task(id=task.id, env="math", task_type="math", messages=task.messages)  # a judged pair's prompt
        for view in (task, bare):
            steps = env.worked_solution(view)
            assert steps is not None and steps.rsplit("= ", 1)[1] == task.answer, (task.metadata["question"], steps)


def test_reasoning_gym_chain_sum_worked_solution_and_others_have_none():
    env = make_environment(
        "reasoning_gym",
        {"dataset": "chain_sum", "dataset_config": {"min_terms": 2, "max_terms": 4, "min_digits": 1, "max_digits": 1}},
    )
    for task in env.tasks("train", seed=0, n=100):
        steps = env.worked_solution(task)
        assert steps is not None and steps.rsplit("= ", 1)[1] == task.answer
    wrong_gold = task.model_copy(update={"answer": str(int(task.answer) + 1)})
    assert env.worked_solution(wrong_gold) is None  # steps that miss the gold are never written
    other = make_environment("reasoning_gym", {"dataset": "spell_backward"})
    assert all(other.worked_solution(t) is None for t in other.tasks("train", seed=0, n=20))


@pytest.mark.parametrize("pair_kind", ["reference", "malformed"])
def test_critic_worked_solution_solves_then_reads_both_answers(pair_kind):
    env = make_environment(
        "critic_calibration",
        {
            "pair_kind": pair_kind,
            "prompt_style": "compact",
            "sources": [{"name": "math", "config": {"difficulty": 1, "problem_types": ["add", "sub", "mul", "word"]}}],
        },
    )
    for task in env.tasks("test", seed=0, n=40):
        steps = env.worked_solution(task)
        assert steps is not None
        solved, read = steps.split(". A: ")
        answer_a, answer_b = read.split(", B: ")
        gold = solved.rsplit("= ", 1)[1]
        assert (
            answer_a if task.answer == "A" else answer_b
        ) == gold  # the verified-correct one says what the steps found
        assert (answer_b if task.answer == "A" else answer_a) != gold
        assert pair_kind == "reference" or "none" in (answer_a, answer_b)
