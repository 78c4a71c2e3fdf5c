"""Importance-sampling weights, the sequence mask and the engine-vs-trainer metrics (k2post/rl/consistency.py),
and the controller's use of them (`apply_is_correction`, `step_consistency`, `routing_metrics`)."""

from __future__ import annotations

import math

import pytest

from k2post.rl.batch import TrainSequence
from k2post.rl.config import ISCorrectionConfig
from k2post.rl.consistency import consistency_metrics, is_weights, sequence_kept, token_kl, weighted_sum
from k2post.rl.controller import apply_is_correction, routing_metrics, step_consistency

ON = ISCorrectionConfig(enabled=True, cap=2.0)
LN2 = math.log(2.0)


@pytest.mark.parametrize(
    ("old", "behaviour", "cfg", "weights", "kept"),
    [
        ([-1.0, -2.0], [-1.0, -2.0], ON, [1.0, 1.0], True),  # same policy: weight 1
        ([-1.0, -2.0], [-1.5, -2.0], ON, [math.exp(0.5), 1.0], True),  # pi_old > mu: up-weighted
        ([-1.0], [-3.0], ON, [2.0], False),  # ratio e^2 > C: truncated at C, sequence masked
        ([-3.0], [-1.0], ON, [math.exp(-2.0)], False),  # ratio e^-2 < 1/C: masked, weight not raised
        ([-1.0, -1.0], [-1.0 - 0.4, -1.0 - 0.4], ON, [math.exp(0.4)] * 2, False),  # product e^0.8 > 2
        (
            [-1.0, -1.0],
            [-1.4, -1.4],
            ISCorrectionConfig(enabled=True, sequence_ratio="token_mean"),
            [math.exp(0.4)] * 2,
            True,
        ),  # geometric mean e^0.4 < 2
        ([-1.0], [-3.0], ISCorrectionConfig(enabled=True, sequence_mask=False), [2.0], True),
        ([-1.0], [-3.0], ISCorrectionConfig(), [1.0], True),  # off: no weights, nothing masked
        ([], [], ON, [], True),
    ],
)
def test_is_weights_truncate_and_mask(old, behaviour, cfg, weights, kept):
    got, keep = is_weights(old, behaviour, cfg)
    assert got == pytest.approx(weights) and keep is kept
    assert all(w <= cfg.cap for w in got)


def test_is_weights_refuse_mismatched_lengths():
    with pytest.raises(ValueError, match="2 trainer log-probs for 1 engine"):
        is_weights([0.0, 0.0], [0.0], ON)


@pytest.mark.parametrize(("log_ratios", "kept"), [([LN2 - 1e-9], True), ([LN2 + 1e-6], False), ([-LN2], True)])
def test_sequence_mask_edges(log_ratios, kept):
    assert sequence_kept(log_ratios, ON) is kept


@pytest.mark.parametrize(
    ("old", "behaviour", "kl"), [(-1.0, -1.0, 0.0), (-1.0, -2.0, math.e - 2.0), (-2.0, -1.0, math.exp(-1) - 1 + 1)]
)
def test_token_kl_is_the_nonnegative_k3_estimate(old, behaviour, kl):
    assert token_kl(old, behaviour) == pytest.approx(kl) and token_kl(old, behaviour) >= 0


def test_consistency_metrics_count_old_versions_masks_and_truncation():
    old = [[-1.0, -1.0], [-1.0, -2.0, -0.5]]
    behaviour = [[-1.0, -1.0], [-1.2, -1.0, -0.5]]
    versions = [[3, 3], [2, 3, 3]]
    row = consistency_metrics(old, behaviour, versions, current_version=3, keeps=[True, False], cap=1.1)
    kls = [0.0, 0.0, token_kl(-1.0, -1.2), token_kl(-2.0, -1.0), 0.0]
    assert row["consistency/kl"] == pytest.approx(sum(kls) / 5)
    assert row["consistency/kl_current"] == pytest.approx((kls[3]) / 4)  # the version-2 token left out
    assert row["consistency/logprob_diff_max"] == pytest.approx(1.0)
    assert row["consistency/older_version_share"] == pytest.approx(1 / 5)
    assert row["consistency/masked_share"] == pytest.approx(0.5)
    assert row["consistency/truncated_share"] == pytest.approx(1 / 5)  # only log-ratio 0.2 > log 1.1
    assert consistency_metrics([], [], [], 0, []) == {}


def _row(behaviour, versions=None):
    return TrainSequence([1] * (len(behaviour) + 1), [0] + [1] * len(behaviour), 0.5, "g/0", behaviour, versions or [])


def test_apply_is_correction_sets_weights_masks_and_the_pi_old_terms():
    shards = [[_row([-1.0, -1.0]), _row([-3.0])], [_row([-2.0])]]
    old = [{"token_logprobs": [[-1.5, -1.0], [-1.0]]}, {"token_logprobs": [[-2.0]]}]
    olds, keeps = apply_is_correction(shards, old, ON)
    assert shards[0][0].token_weights == pytest.approx([math.exp(-0.5), 1.0]) and shards[0][0].keep
    assert shards[0][1].token_weights == [2.0] and shards[0][1].keep is False
    assert olds == [[pytest.approx(-1.5 * math.exp(-0.5) - 1.0), pytest.approx(-2.0)], [pytest.approx(-2.0)]]
    assert keeps == [True, False, True]
    off = [[_row([-3.0])]]
    olds, _ = apply_is_correction(off, [{"token_logprobs": [[-1.0]]}], ISCorrectionConfig())
    assert off[0][0].token_weights is None and off[0][0].keep and olds == [[-1.0]]  # plain pi_old sum


def test_rows_without_engine_logprobs_train_unweighted_and_stay_out_of_the_metrics():
    shards = [[_row([])]]
    shards[0][0].loss_mask = [0, 1, 1]
    shards[0][0].token_ids = [1, 2, 3]
    olds, _ = apply_is_correction(shards, [{"token_logprobs": [[-1.0, -2.0]]}], ON)
    assert shards[0][0].token_weights == [1.0, 1.0] and olds == [[-3.0]]
    assert step_consistency(shards[0], [[-1.0, -2.0]], 0, [True], None) == {}


def test_routing_metrics_are_shares_of_recorded_tokens():
    results = [{"routing": {"tokens": 10, "disagree": 2, "disagree_used": 0}}] * 2
    assert routing_metrics(results) == {"routing/disagree": 0.2, "routing/disagree_used": 0.0, "routing/tokens": 20.0}
    assert routing_metrics([{"routing": {"tokens": 0, "disagree": 0, "disagree_used": 0}}]) == {}


def test_weighted_sum():
    assert weighted_sum([1.0, 2.0], [0.5, 2.0]) == 4.5
