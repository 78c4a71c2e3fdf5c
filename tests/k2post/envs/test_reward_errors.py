"""k2post/envs/reward_errors.py: first error texts per env, one-line descriptions, the fail-fast share check."""

from __future__ import annotations

import pytest

from k2post.envs.reward_errors import (
    RewardErrorsExceeded,
    check_error_fraction,
    describe_errors,
    error_samples,
    error_share_problem,
)

NAMES = ["math", "math", "code", "math", "code", "math"]
ERRORS = [None, "ValueError: a", "TimeoutError: t", "ValueError: a", None, "KeyError: 'k'"]


@pytest.mark.parametrize(
    "per_env, expected",
    [
        (3, {"math": ["ValueError: a", "KeyError: 'k'"], "code": ["TimeoutError: t"]}),
        (1, {"math": ["ValueError: a"], "code": ["TimeoutError: t"]}),
    ],
)
def test_error_samples_keep_the_first_distinct_texts_per_env(per_env, expected):
    assert error_samples(NAMES, ERRORS, per_env) == expected
    assert error_samples(["math"], [None]) == {}


def test_describe_errors_counts_per_env():
    assert describe_errors(NAMES, ERRORS) == [
        "math: 3 of 4 rewards failed; first: ValueError: a",
        "code: 1 of 2 rewards failed; first: TimeoutError: t",
    ]


@pytest.mark.parametrize(
    "failed, total, limit, fails",
    [(0, 0, 0.0, False), (2, 4, 0.5, False), (3, 4, 0.5, True), (1, 10, 0.0, True), (10, 10, 1.0, False)],
)
def test_error_share_problem(failed, total, limit, fails):
    problem = error_share_problem("iteration 3", failed, total, limit, "reward.max_reward_error_fraction", "x: E")
    assert (problem is not None) == fails
    if fails:
        assert problem.startswith(f"iteration 3: {failed} of {total} rewards failed")
        assert "first: x: E" in problem and "raise reward.max_reward_error_fraction" in problem


def test_check_error_fraction_is_one_line_naming_the_first_error():
    with pytest.raises(RewardErrorsExceeded) as raised:
        check_error_fraction(NAMES, ERRORS, 0.5, "iteration 2", "reward.max_reward_error_fraction")
    message = str(raised.value)
    assert "\n" not in message and "4 of 6 rewards failed (67% > reward.max_reward_error_fraction 0.5)" in message
    assert "first: math: ValueError: a" in message
    check_error_fraction(NAMES, ERRORS, 0.7, "iteration 2", "reward.max_reward_error_fraction")  # 67% <= 70%
