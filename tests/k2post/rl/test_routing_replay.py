"""Routing replay in the trainer's forward (k2post/rl/routing_replay.py): pure pieces by table, then the hooks
on a tiny-k2 (DeepSeek-V3 layout) transformers model."""

from __future__ import annotations

import pytest
import torch

from k2post.rl.routing_replay import (
    RoutingReplay,
    RoutingReplayError,
    forced_indices,
    recorded_batch,
    replayed_weights,
    top_k_differs,
)


@pytest.mark.parametrize(
    ("first", "second", "differs"),
    [([[0, 1]], [[1, 0]], [False]), ([[0, 1]], [[0, 2]], [True]), ([[3, 1], [2, 2]], [[1, 3], [2, 1]], [False, True])],
)
def test_top_k_differs_ignores_order(first, second, differs):
    assert top_k_differs(torch.tensor(first), torch.tensor(second)).tolist() == differs


def test_forced_indices_replace_only_replayed_rows():
    own, recorded = torch.tensor([[0, 1], [2, 3]]), torch.tensor([[5, 6], [-1, -1]], dtype=torch.int16)
    assert forced_indices(own, recorded, torch.tensor([True, False])).tolist() == [[5, 6], [2, 3]]


@pytest.mark.parametrize("norm", [True, False])
def test_replayed_weights_are_sigmoid_scores_at_the_forced_experts(norm):
    logits = torch.tensor([[0.0, 1.0, -1.0, 2.0]])
    got = replayed_weights(logits, torch.tensor([[3, 0]]), norm, scale=2.5)
    scores = torch.sigmoid(torch.tensor([2.0, 0.0]))
    want = (scores / scores.sum() if norm else scores) * 2.5
    torch.testing.assert_close(got[0], want)


def test_recorded_batch_pads_with_minus_one_and_is_none_without_records():
    first = torch.arange(12, dtype=torch.int16).reshape(3, 2, 2).numpy()
    batch = recorded_batch([first, None], width=4, layers=2, top_k=2)
    assert batch.shape == (2, 4, 2, 2) and (batch[0, :3] == torch.as_tensor(first)).all()
    assert (batch[0, 3] == -1).all() and (batch[1] == -1).all()
    assert recorded_batch([None, None], 4, 2, 2) is None


@pytest.fixture(scope="module")
def k2_model(tiny_k2_dir):
    from k2post.models.loading import load_causal_lm

    return load_causal_lm(tiny_k2_dir, "float32").eval()


def _own_routing(model, replay, ids):
    """The model's own top-k per token and MoE layer: int16 [B, T, L, k]."""
    seen = {}
    handles = [
        replay.gates[layer].register_forward_hook(lambda m, i, o, layer=layer: seen.__setitem__(layer, o[2]))
        for layer in replay.layers
    ]
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    for handle in handles:
        handle.remove()
    stacked = torch.stack([seen[layer] for layer in replay.layers], dim=1)  # [B*T, L, k]
    return stacked.reshape(*ids.shape, len(replay.layers), replay.top_k).to(torch.int16), logits


def test_replaying_the_models_own_routing_changes_nothing(k2_model):
    replay = RoutingReplay(k2_model)
    ids = torch.tensor([[5, 17, 40, 99, 3, 8], [7, 7, 120, 6, 2, 11]])
    own, logits = _own_routing(k2_model, replay, ids)
    valid = torch.ones(ids.shape, dtype=torch.bool)
    with torch.no_grad(), replay.forcing(own, valid) as stats:
        replayed = k2_model(input_ids=ids).logits
    torch.testing.assert_close(replayed, logits)
    assert (stats.tokens, stats.disagree, stats.disagree_used) == (12, 0, 0)


def test_forced_experts_are_used_counted_and_trained_through_the_router(k2_model):
    replay = RoutingReplay(k2_model)
    ids = torch.tensor([[5, 17, 40, 99, 3, 8]])
    own, logits = _own_routing(k2_model, replay, ids)
    other = (own + 1) % 8  # different experts everywhere (8 routed experts; shifting keeps each pair distinct)
    other[0, 0] = -1  # one token without a record keeps its own routing
    valid = torch.ones(ids.shape, dtype=torch.bool)
    with torch.no_grad(), replay.forcing(other, valid, replay=False) as measured:
        unforced = k2_model(input_ids=ids).logits
    torch.testing.assert_close(unforced, logits)  # measuring alone changes nothing
    assert (measured.tokens, measured.disagree, measured.disagree_used) == (5, 5, 5)
    k2_model.zero_grad()
    with replay.forcing(other, valid) as forced:
        out = k2_model(input_ids=ids).logits
    assert (forced.tokens, forced.disagree, forced.disagree_used) == (5, 5, 0)
    assert not torch.allclose(out, logits)  # other experts: other outputs
    out.logsumexp(-1).sum().backward()
    gate = replay.gates[replay.layers[0]]
    assert gate.weight.grad is not None and gate.weight.grad.abs().sum() > 0  # the router still learns


def test_routing_shape_mismatch_and_dense_models_are_clear_errors(k2_model, tiny_qwen2_dir):
    from k2post.models.loading import load_causal_lm

    replay = RoutingReplay(k2_model)
    with pytest.raises(RoutingReplayError, match="does not fit"):
        with replay.forcing(torch.zeros((1, 4, 1, 2), dtype=torch.int16), torch.ones((1, 4), dtype=torch.bool)):
            pass
    with pytest.raises(RoutingReplayError, match="no DeepSeek-V3-style MoE gates"):
        RoutingReplay(load_causal_lm(tiny_qwen2_dir, "float32"))
