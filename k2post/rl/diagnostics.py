"""Group-level learning-signal diagnostics: is there anything for the K1.5 loss to learn from?

Pure functions over the (shaped) rewards of the groups an optimizer step trains on:

    row.update(group_diagnostics(rewards_per_group, env_per_group))
    # {"rollout/groups_nonzero_adv_frac": 0.25, "rollout/reward_std_mean": 0.11, "rollout/reward_std_max": 0.5,
    #  "rollout/groups_nonzero_adv_frac/math": 0.5, ...}

A group whose K rewards are all equal has advantages r_i - mean(r) == 0 for every sample: its only
gradient is the tau * logratio brake, so it teaches nothing. When the nonzero-advantage fraction is
near 0 (every prompt solved by all K samples, or by none), RL is flat whatever the optimizer does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

SIGNAL_TOLERANCE = 1e-6  # rewards closer than this count as equal (float noise of shaping)


def group_has_signal(rewards: Sequence[float], tolerance: float = SIGNAL_TOLERANCE) -> bool:
    """True when some advantage r_i - mean(r) of the group is nonzero (max - min reward > tolerance)."""
    return len(rewards) > 1 and max(rewards) - min(rewards) > tolerance


def group_reward_std(rewards: Sequence[float]) -> float:
    """Population std of one group's rewards (0.0 for an empty or single-sample group)."""
    if not rewards:
        return 0.0
    mean = sum(rewards) / len(rewards)
    return math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))


def nonzero_adv_fraction(rewards_per_group: Sequence[Sequence[float]], tolerance: float = SIGNAL_TOLERANCE) -> float:
    """Share of groups with some nonzero advantage (nan for no groups)."""
    if not rewards_per_group:
        return math.nan
    return sum(group_has_signal(g, tolerance) for g in rewards_per_group) / len(rewards_per_group)


def group_diagnostics(
    rewards_per_group: Sequence[Sequence[float]], env_per_group: Sequence[str], tolerance: float = SIGNAL_TOLERANCE
) -> dict[str, float]:
    """`rollout/groups_nonzero_adv_frac` (overall and `/<env>`), `rollout/reward_std_mean|max` over the
    groups' per-group reward std; {} for no groups (no metric rather than a misleading 0)."""
    if len(rewards_per_group) != len(env_per_group):
        raise ValueError(f"{len(rewards_per_group)} groups but {len(env_per_group)} env names")
    if not rewards_per_group:
        return {}
    stds = [group_reward_std(g) for g in rewards_per_group]
    row = {
        "rollout/groups_nonzero_adv_frac": nonzero_adv_fraction(rewards_per_group, tolerance),
        "rollout/reward_std_mean": sum(stds) / len(stds),
        "rollout/reward_std_max": max(stds),
    }
    for env in sorted(set(env_per_group)):
        mine = [g for g, e in zip(rewards_per_group, env_per_group) if e == env]
        row[f"rollout/groups_nonzero_adv_frac/{env}"] = nonzero_adv_fraction(mine, tolerance)
    return row


def is_agentic(samples: Sequence[Any]) -> bool:
    """An env's samples are agentic when some episode called a tool (well-formed or not) or took > 1 turn."""
    return any(s.tool_calls or s.malformed_calls or s.turns > 1 for s in samples)


def agentic_metrics(samples: Sequence[Any], success_threshold: float) -> dict[str, float]:
    """Per agentic env: `agent/<env>/success_rate` (reward >= threshold), `well_formed_call_rate` (well-formed
    / all attempted calls; nan without calls), `turns_mean`, `tool_calls_mean`, `tool_errors_mean`.
    `samples` carry `env_name, reward, turns, tool_calls, malformed_calls, tool_errors` (`rl.batch.Sample`)."""
    row: dict[str, float] = {}
    for env in sorted({s.env_name for s in samples}):
        mine = [s for s in samples if s.env_name == env]
        if not is_agentic(mine):
            continue
        n, calls, bad = len(mine), sum(s.tool_calls for s in mine), sum(s.malformed_calls for s in mine)
        row |= {
            f"agent/{env}/success_rate": sum(s.reward >= success_threshold for s in mine) / n,
            f"agent/{env}/well_formed_call_rate": calls / (calls + bad) if calls + bad else math.nan,
            f"agent/{env}/turns_mean": sum(s.turns for s in mine) / n,
            f"agent/{env}/tool_calls_mean": calls / n,
            f"agent/{env}/tool_errors_mean": sum(s.tool_errors for s in mine) / n,
        }
        row |= long_episode_metrics(env, mine)
    return row


def long_episode_metrics(env: str, samples: Sequence[Any]) -> dict[str, float]:
    """`agent/<env>/context_peak_mean` (longest context a generation saw, tokens), `elisions_mean`, and
    `checkpoint_pass_rate` where the env reports rubric checkpoints (`Sample.checkpoint_pass_rate`)."""
    row: dict[str, float] = {}
    contexts = [s.context for s in samples if getattr(s, "context", None)]
    if contexts:
        row[f"agent/{env}/context_peak_mean"] = sum(c["context_peak"] for c in contexts) / len(contexts)
        row[f"agent/{env}/elisions_mean"] = sum(c["elisions"] for c in contexts) / len(contexts)
    rates = [s.checkpoint_pass_rate for s in samples if getattr(s, "checkpoint_pass_rate", None) is not None]
    if rates:
        row[f"agent/{env}/checkpoint_pass_rate"] = sum(rates) / len(rates)
    return row
