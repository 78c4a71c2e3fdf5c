"""Reward shaping of the K2 recipe as free functions: budget control and the K1.5 length penalty.

    rewards = apply_budget(rewards, truncated, BudgetConfig(penalty="replace", penalty_value=0.0))
    bonus = length_rewards(lengths, correct)          # per group of K samples, K1.5 formula

Length reward (K1.5): over the K samples of one prompt with lengths len_i,
lambda_i = 0.5 - (len_i - min_len) / (max_len - min_len); a correct sample gets +lambda_i, an
incorrect one min(0, lambda_i); all get 0 when max_len == min_len.
"""

from __future__ import annotations

from collections.abc import Sequence

from k2post.rl.config import BudgetConfig, LengthPenaltyConfig


def apply_budget(rewards: Sequence[float], truncated: Sequence[bool], cfg: BudgetConfig) -> list[float]:
    """Penalize the rewards of responses that hit their token budget."""
    if len(rewards) != len(truncated):
        raise ValueError(f"{len(rewards)} rewards but {len(truncated)} truncation flags")
    if cfg.penalty == "none":
        return list(rewards)
    if cfg.penalty == "replace":
        return [cfg.penalty_value if cut else r for r, cut in zip(rewards, truncated)]
    return [r - cfg.penalty_value if cut else r for r, cut in zip(rewards, truncated)]


def length_rewards(lengths: Sequence[int], correct: Sequence[bool]) -> list[float]:
    """The K1.5 length reward of one group of samples."""
    if len(lengths) != len(correct):
        raise ValueError(f"{len(lengths)} lengths but {len(correct)} correctness flags")
    low, high = min(lengths), max(lengths)
    if high == low:
        return [0.0] * len(lengths)
    lambdas = [0.5 - (n - low) / (high - low) for n in lengths]
    return [lam if ok else min(0.0, lam) for lam, ok in zip(lambdas, correct)]


def grouped_length_rewards(
    lengths: Sequence[int], correct: Sequence[bool], group_size: int, cfg: LengthPenaltyConfig, iteration: int
) -> list[float]:
    """Length rewards of consecutive groups of `group_size`, scaled; zeros while off or warming up."""
    if not cfg.enabled or iteration < cfg.warmup_iterations:
        return [0.0] * len(lengths)
    if len(lengths) % group_size:
        raise ValueError(f"{len(lengths)} samples is not a multiple of group_size={group_size}")
    out: list[float] = []
    for start in range(0, len(lengths), group_size):
        group = length_rewards(lengths[start : start + group_size], correct[start : start + group_size])
        out += [cfg.weight * value for value in group]
    return out
