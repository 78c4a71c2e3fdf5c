"""Aggregation: known tournaments, order invariance, and Bradley–Terry vs a brute-force optimum."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from k2post_rubrics.aggregate import bradley_terry, bradley_terry_log_strengths, scores_from, win_rates

METHODS = ["win_rate", "bradley_terry"]


def _strict(n: int, repeats: int = 1):
    """Response i beats every j > i."""
    return [(i, j, 1.0) for i, j in itertools.combinations(range(n), 2)] * repeats


def _all_ties(n: int):
    return [(i, j, 0.5) for i, j in itertools.permutations(range(n), 2)]


ROCK_PAPER_SCISSORS = [(0, 1, 1.0), (1, 2, 1.0), (2, 0, 1.0)]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_strict_order_gives_strictly_ordered_scores(method, n):
    scores = scores_from(method, n, _strict(n))
    assert all(a > b for a, b in zip(scores, scores[1:])), scores
    assert all(0.0 <= s <= 1.0 for s in scores)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(
    ("n", "outcomes"),
    [
        (4, _all_ties(4)),
        (3, ROCK_PAPER_SCISSORS),
        (3, ROCK_PAPER_SCISSORS * 3),
        (5, [(i, (i + 1) % 5, 1.0) for i in range(5)]),
        (3, []),
        (1, []),
    ],
    ids=["ties", "rps", "rps3", "5-cycle", "no-games", "single"],
)
def test_symmetric_tournaments_give_equal_scores(method, n, outcomes):
    scores = scores_from(method, n, outcomes)
    assert scores == pytest.approx([0.5] * n, abs=1e-9)


@pytest.mark.parametrize(
    ("n", "outcomes", "expected"),
    [
        (3, [(0, 1, 1.0), (1, 2, 1.0), (0, 2, 0.5)], [0.75, 0.5, 0.25]),
        (2, [(0, 1, 0.0), (0, 1, 0.0), (1, 0, 0.5)], [1 / 6, 5 / 6]),
        (3, [(0, 1, 1.0)], [1.0, 0.0, 0.5]),
        (0, [], []),
    ],
)
def test_win_rates_known_values(n, outcomes, expected):
    assert win_rates(n, outcomes) == pytest.approx(expected)


def _neg_log_posterior(x: np.ndarray, outcomes, prior: float) -> np.ndarray:
    """Independent numpy objective, vectorized over the rows of x (grid points)."""
    total = np.zeros(x.shape[0])
    for i, j, s in outcomes:
        diff = x[:, i] - x[:, j]
        total += s * np.logaddexp(0.0, -diff) + (1.0 - s) * np.logaddexp(0.0, diff)
    for k in range(x.shape[1]):
        total += prior / 2.0 * (np.logaddexp(0.0, -x[:, k]) + np.logaddexp(0.0, x[:, k]))
    return total


def _grid_optimum(n: int, outcomes, prior: float) -> np.ndarray:
    """Brute force: a zooming grid search over the n log-strengths (no gradients, no solver)."""
    center, radius, points = np.zeros(n), 8.0, 25
    for _ in range(30):
        axes = [np.linspace(c - radius, c + radius, points) for c in center]
        grid = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, n)
        center = grid[np.argmin(_neg_log_posterior(grid, outcomes, prior))]
        radius *= 0.5
    return center - center.mean()


SMALL = [(0, 1, 1.0), (0, 1, 1.0), (1, 2, 1.0), (0, 2, 0.5), (2, 1, 1.0), (2, 0, 0.0), (1, 0, 0.5)]


@pytest.mark.parametrize("prior", [0.5, 0.1, 2.0])
@pytest.mark.parametrize("solver", ["newton", "mm"])
def test_bradley_terry_matches_brute_force(prior, solver):
    expected = _grid_optimum(3, SMALL, prior)
    got = bradley_terry_log_strengths(3, SMALL, prior=prior, solver=solver, iters=20000, tol=1e-12)
    assert np.abs(np.array(got) - expected).max() < 1e-4


def test_bradley_terry_default_is_accurate_on_lopsided_tournaments():
    strict = _strict(6, repeats=2)
    fast = bradley_terry_log_strengths(6, strict, prior=0.1)
    slow = bradley_terry_log_strengths(6, strict, prior=0.1, solver="mm", iters=200_000, tol=1e-13)
    assert np.abs(np.array(fast) - np.array(slow)).max() < 1e-5


def test_bradley_terry_probabilities_and_centering():
    logs = bradley_terry_log_strengths(4, _strict(4))
    probs = bradley_terry(4, _strict(4))
    assert sum(logs) == pytest.approx(0.0, abs=1e-12)
    assert probs == pytest.approx([1 / (1 + np.exp(-x)) for x in logs])
    assert probs[0] + probs[3] == pytest.approx(1.0)  # antisymmetric tournament → mirrored scores


def test_undefeated_stays_finite_and_prior_shrinks():
    strong = bradley_terry(2, [(0, 1, 1.0)] * 20, prior=0.01)
    weak = bradley_terry(2, [(0, 1, 1.0)] * 20, prior=10.0)
    assert 0.5 < weak[0] < strong[0] < 1.0
    assert np.isfinite(bradley_terry_log_strengths(2, [(0, 1, 1.0)] * 20, prior=1e-6)).all()


@pytest.mark.parametrize("method", METHODS)
def test_order_of_outcomes_does_not_matter(method):
    rng = random.Random(0)
    outcomes = [(rng.randrange(5), rng.randrange(5), rng.choice([0.0, 0.5, 1.0])) for _ in range(60)]
    outcomes = [(i, j, s) for i, j, s in outcomes if i != j]
    base = scores_from(method, 5, outcomes)
    for _ in range(5):
        rng.shuffle(outcomes)
        assert scores_from(method, 5, outcomes) == pytest.approx(base, abs=1e-9)
    flipped = [(j, i, 1.0 - s) for i, j, s in outcomes]
    assert scores_from(method, 5, flipped) == pytest.approx(base, abs=1e-9)


@pytest.mark.parametrize("method", METHODS)
def test_unplayed_response_sits_in_the_middle(method):
    scores = scores_from(method, 3, [(0, 1, 1.0)])
    assert scores[0] > scores[2] > scores[1]
    assert scores[2] == pytest.approx(0.5, abs=1e-9 if method == "win_rate" else 0.05)


@pytest.mark.parametrize(
    ("n", "outcomes", "match"),
    [
        (2, [(0, 2, 1.0)], "indices"),
        (2, [(1, 1, 1.0)], "indices"),
        (2, [(-1, 0, 1.0)], "indices"),
        (2, [(0, 1, 1.5)], "s must be in"),
        (2, [(0, 1, float("nan"))], "s must be in"),
        (-1, [], "n must be"),
    ],
)
@pytest.mark.parametrize("method", METHODS)
def test_bad_outcomes_raise(method, n, outcomes, match):
    with pytest.raises(ValueError, match=match):
        scores_from(method, n, outcomes)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"prior": 0.0}, "prior must be > 0"), ({"solver": "lbfgs"}, "unknown solver")],
)
def test_bad_bradley_terry_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bradley_terry(2, [(0, 1, 1.0)], **kwargs)


def test_unknown_method():
    with pytest.raises(ValueError, match="unknown aggregation"):
        scores_from("elo", 2, [])  # type: ignore[arg-type]
