"""Train-inference consistency: importance-sampling weights and the engine-vs-trainer metrics (pure functions).

The rollout engine samples each model token y_t from the behaviour policy mu (its weights, its dtype, its
kernels, the sampling temperature, possibly an older policy version for partial rollouts); K1.5 measures the
log-ratio against pi_old, the trainer's weights at the start of the iteration, tempered like the sample was
(`losses.temper`). With `loss.is_correction` the trainer weights every token

    w_t = min(pi_old(y_t) / mu(y_t), C)                       (truncated importance sampling, detached)

inside the K1.5 log-ratio, and drops an episode (all its context windows) when its ratio is off: the per-token
geometric mean g = exp(mean_t log(pi_old / mu)) leaves [mask_low, mask_high] AND the whole ratio exp(sum_t ...)
leaves [1/B, B] (B = mask_product_band). Long responses are judged by g, which bf16 noise keeps within ~1e-4 of
1 at any length; short ones by the product, whose noise is small when few tokens add up:

    L = (1/N) sum_i m_i (A_i - tau * sum_t w_t (log pi_theta(y_t) - log pi_old(y_t)))^2,   N = sum_i m_i

At theta = theta_old its gradient is -(2 tau / N) sum_i m_i A_i sum_t w_t grad log pi_theta(y_t): the token-level
truncated-IS policy gradient with K1.5's mean baseline over the kept episodes (docs/RL.md). Tested in
tests/k2post/rl/test_consistency.py; the controller (`k2post/rl/controller.py`) calls exactly these functions.

    weights, keep = is_weights(old_tokens, behaviour_tokens, cfg)       # per model token; episode kept?
    old = weighted_sum(old_tokens, weights)                              # the row's pi_old term
    row = consistency_metrics(old_by_row, behaviour_by_row, versions_by_row, current_version, keeps)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from k2post.rl.config import ISCorrectionConfig


def is_weights(
    old_tokens: Sequence[float], behaviour_tokens: Sequence[float], cfg: ISCorrectionConfig
) -> tuple[list[float], bool]:
    """(w_t per model token, whether the sequence is kept). All ones and kept when the correction is off."""
    if len(old_tokens) != len(behaviour_tokens):
        raise ValueError(f"{len(old_tokens)} trainer log-probs for {len(behaviour_tokens)} engine log-probs")
    if not cfg.enabled:
        return [1.0] * len(old_tokens), True
    log_ratios = [o - b for o, b in zip(old_tokens, behaviour_tokens)]
    weights = [min(math.exp(min(r, 50.0)), cfg.cap) for r in log_ratios]
    return weights, sequence_kept(log_ratios, cfg)


def sequence_kept(log_ratios: Sequence[float], cfg: ISCorrectionConfig) -> bool:
    """Whether an episode passes the mask: its per-token geometric mean ratio lies in [mask_low, mask_high], or its
    whole ratio in [1/B, B] (B = mask_product_band)."""
    if not cfg.sequence_mask or not log_ratios:
        return True
    total = sum(log_ratios)
    mean = total / len(log_ratios)
    if math.log(cfg.mask_low) <= mean <= math.log(cfg.mask_high):
        return True
    return abs(total) <= math.log(cfg.mask_product_band)


def weighted_sum(values: Sequence[float], weights: Sequence[float]) -> float:
    """sum_t w_t * v_t (the row's pi_old term in the weighted log-ratio)."""
    return float(sum(w * v for w, v in zip(weights, values)))


def token_kl(old: float, behaviour: float) -> float:
    """One-sample estimate of KL(mu || pi_old) at a token drawn from mu: r - 1 - log r with r = pi_old / mu
    (the non-negative, unbiased "k3" estimator)."""
    log_r = old - behaviour
    return math.expm1(min(log_r, 50.0)) - log_r


def consistency_metrics(
    old_by_row: Sequence[Sequence[float]],
    behaviour_by_row: Sequence[Sequence[float]],
    versions_by_row: Sequence[Sequence[int]],
    current_version: int,
    keeps: Sequence[bool],
    cap: float | None = None,
) -> dict[str, float]:
    """`consistency/*` of one iteration's trained rows (per model token unless said):

    kl: mean KL(engine || trainer); kl_current: the same over tokens of the current policy version only (the
    numerical gap); logprob_diff_max: max |log pi_old - log mu|; older_version_share: tokens written by an older
    version; masked_share / masked_episodes: episodes the IS mask dropped (`keeps`: one flag per episode);
    truncated_share: tokens whose ratio hit the cap."""
    kls, kls_current, diffs, older, truncated = [], [], [], 0, 0
    for old, behaviour, versions in zip(old_by_row, behaviour_by_row, versions_by_row):
        for index, (o, b) in enumerate(zip(old, behaviour)):
            kl = token_kl(o, b)
            kls.append(kl)
            diffs.append(abs(o - b))
            stale = index < len(versions) and versions[index] < current_version
            older += stale
            if not stale:
                kls_current.append(kl)
            truncated += cap is not None and o - b > math.log(cap)
    if not kls:
        return {}
    return {
        "consistency/kl": sum(kls) / len(kls),
        "consistency/kl_current": sum(kls_current) / len(kls_current) if kls_current else 0.0,
        "consistency/logprob_diff_max": max(diffs),
        "consistency/older_version_share": older / len(kls),
        "consistency/masked_share": 1.0 - sum(map(bool, keeps)) / max(len(keeps), 1),
        "consistency/masked_episodes": float(len(keeps) - sum(map(bool, keeps))),
        "consistency/episodes": float(len(keeps)),
        "consistency/truncated_share": truncated / len(kls),
        "consistency/tokens": float(len(kls)),
    }
