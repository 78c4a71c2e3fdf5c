"""Reward errors that speak up: the first error texts of each environment, and the fail-fast check behind
`max_reward_error_fraction` (RL's `reward:` section, `k2post eval`).

A scorer that raises, hangs, or returns a value outside its env's `reward_range` gives an error reward (the
range's minimum, `Reward.error` set; k2post/envs/workers.py). Counting them is not enough: these helpers keep
the first distinct texts per environment for consoles, logs and reports, and stop a step whose error share
passes the limit with one line that names the env and the first error. `errors` are `Reward.error` values
(None: no error), one per reward, beside the env name of each.

    samples = error_samples(["math", "math"], [None, "ValueError: bad"])       # {"math": ["ValueError: bad"]}
    check_error_fraction(names, errors, 0.5, "iteration 3", "reward.max_reward_error_fraction")
"""

from __future__ import annotations

from collections.abc import Sequence

SAMPLES_PER_ENV = 3


class RewardErrorsExceeded(ValueError):
    """Too many rewards of one step failed; the message names the limit, the env and the first error."""


def error_samples(
    env_names: Sequence[str], errors: Sequence[str | None], per_env: int = SAMPLES_PER_ENV
) -> dict[str, list[str]]:
    """env name -> its first `per_env` distinct error texts (envs without errors are left out)."""
    out: dict[str, list[str]] = {}
    for name, error in zip(env_names, errors, strict=True):
        if error is None:
            continue
        seen = out.setdefault(name, [])
        if error not in seen and len(seen) < per_env:
            seen.append(error)
    return out


def describe_errors(env_names: Sequence[str], errors: Sequence[str | None]) -> list[str]:
    """One line per env with errors: `math: 2 of 16 rewards failed; first: ValueError: ...`."""
    lines = []
    for name, texts in error_samples(env_names, errors, per_env=1).items():
        mine = [error for other, error in zip(env_names, errors) if other == name]
        failed = sum(error is not None for error in mine)
        lines.append(f"{name}: {failed} of {len(mine)} rewards failed; first: {texts[0]}")
    return lines


def error_share_problem(where: str, failed: int, total: int, limit: float, field: str, first: str) -> str | None:
    """The one-line message when `failed / total` passes `limit` (None when it does not)."""
    if not total or failed / total <= limit:
        return None
    return (
        f"{where}: {failed} of {total} rewards failed ({failed / total:.0%} > {field} {limit:g}); first: {first} "
        f"(fix the scorer, or raise {field})"
    )


def check_error_fraction(
    env_names: Sequence[str], errors: Sequence[str | None], limit: float, where: str, field: str
) -> None:
    """RewardErrorsExceeded when more than `limit` of the rewards failed (`field` names the setting)."""
    failed = sum(error is not None for error in errors)
    first = next((f"{n}: {e}" for n, e in zip(env_names, errors) if e is not None), "")
    problem = error_share_problem(where, failed, len(errors), limit, field, first)
    if problem:
        raise RewardErrorsExceeded(problem)
