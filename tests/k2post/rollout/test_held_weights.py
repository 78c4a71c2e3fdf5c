"""What a verified push checks after loading (`k2post.rollout.held_weights`): where the engine holds each served
tensor, and the equal / rounded / wrong verdict of the engine's own parameters. The real engine (a loader that
transposes or swaps tensors, a bf16 engine): tests/k2post/rollout/test_weight_update.py via verified_push_worker.py."""

from __future__ import annotations

import pytest
import torch

from k2post.rollout.held_weights import Slot, check_held, engine_slots, expected_held, held_verdicts
from k2post.rollout.weight_update import PushVerificationError

L = "model.layers.1"
HF = {
    f"{L}.self_attn.q_proj.weight": (8, 4),
    f"{L}.self_attn.k_proj.weight": (2, 4),
    f"{L}.self_attn.v_proj.weight": (2, 4),
    f"{L}.self_attn.q_proj.bias": (8,),
    f"{L}.self_attn.k_proj.bias": (2,),
    f"{L}.self_attn.v_proj.bias": (2,),
    f"{L}.self_attn.q_a_proj.weight": (3, 4),
    f"{L}.self_attn.kv_a_proj_with_mqa.weight": (5, 4),
    f"{L}.mlp.shared_experts.gate_proj.weight": (6, 4),
    f"{L}.mlp.shared_experts.up_proj.weight": (6, 4),
    f"{L}.mlp.experts.1.up_proj.weight": (6, 4),
    f"{L}.mlp.experts.1.down_proj.weight": (4, 6),
    "model.embed_tokens.weight": (10, 4),
    "model.layers.1.self_attn.nowhere.weight": (2, 2),
}
ENGINE = {
    f"{L}.self_attn.qkv_proj.weight",
    f"{L}.self_attn.qkv_proj.bias",
    f"{L}.self_attn.fused_qkv_a_proj.weight",
    f"{L}.mlp.shared_experts.gate_up_proj.weight",
    f"{L}.mlp.experts.routed_experts.w13_weight",
    f"{L}.mlp.experts.routed_experts.w2_weight",
    "model.embed_tokens.weight",
}


@pytest.mark.parametrize(
    ("name", "slot"),
    [
        (f"{L}.self_attn.q_proj.weight", Slot(f"{L}.self_attn.qkv_proj.weight", None, 0, 8)),
        (f"{L}.self_attn.k_proj.weight", Slot(f"{L}.self_attn.qkv_proj.weight", None, 8, 10)),
        (f"{L}.self_attn.v_proj.bias", Slot(f"{L}.self_attn.qkv_proj.bias", None, 10, 12)),
        (f"{L}.self_attn.kv_a_proj_with_mqa.weight", Slot(f"{L}.self_attn.fused_qkv_a_proj.weight", None, 3, 8)),
        (f"{L}.mlp.shared_experts.up_proj.weight", Slot(f"{L}.mlp.shared_experts.gate_up_proj.weight", None, 6, 12)),
        (f"{L}.mlp.experts.1.up_proj.weight", Slot(f"{L}.mlp.experts.routed_experts.w13_weight", 1, 6, 12)),
        (f"{L}.mlp.experts.1.down_proj.weight", Slot(f"{L}.mlp.experts.routed_experts.w2_weight", 1, 0, 4)),
        ("model.embed_tokens.weight", Slot("model.embed_tokens.weight", None, 0, 10)),
        ("model.layers.1.self_attn.nowhere.weight", None),
    ],
)
def test_engine_slots_name_the_rows_that_hold_each_served_tensor(name, slot):
    assert engine_slots(HF, ENGINE)[name] == slot


def test_a_fused_piece_whose_sibling_was_not_pushed_has_no_slot():
    shapes = {f"{L}.self_attn.k_proj.weight": (2, 4)}  # q_proj's rows come first and are unknown
    assert engine_slots(shapes, ENGINE) == {f"{L}.self_attn.k_proj.weight": None}


def _engine(q, k, dtype):
    """A fake engine's parameters: q and k stacked the way vLLM's qkv loader does, plus a norm."""
    return {"a.qkv_proj.weight": torch.cat([q, k]).to(dtype), "norm.weight": torch.ones(4, dtype=dtype)}


@pytest.mark.parametrize(
    ("dtype", "loader", "verdicts"),
    [
        (torch.float32, "right", {"a.q_proj.weight": "equal", "a.k_proj.weight": "equal", "norm.weight": "equal"}),
        (torch.bfloat16, "right", {"a.q_proj.weight": "rounded", "a.k_proj.weight": "rounded", "norm.weight": "equal"}),
        (torch.float32, "swapped", {"a.q_proj.weight": "wrong", "a.k_proj.weight": "wrong", "norm.weight": "equal"}),
        (torch.float32, "transposed", {"a.q_proj.weight": "wrong", "a.k_proj.weight": "equal", "norm.weight": "equal"}),
        (torch.bfloat16, "stale", {"a.q_proj.weight": "wrong", "a.k_proj.weight": "rounded", "norm.weight": "equal"}),
    ],
)
def test_held_verdicts_tell_equal_rounded_and_wrong(dtype, loader, verdicts):
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(4, 4, generator=gen), torch.randn(4, 4, generator=gen)
    served = [("a.q_proj.weight", q), ("a.k_proj.weight", k), ("norm.weight", torch.ones(4))]
    held_q, held_k = {"right": (q, k), "swapped": (k, q), "transposed": (q.T, k), "stale": (q + 1, k)}[loader]
    expected = expected_held(served, [str(torch.float32), str(dtype)])
    assert held_verdicts(_engine(held_q, held_k, dtype), expected) == verdicts


def test_an_int4_round_trip_in_a_bf16_engine_is_held_rounded():
    from k2post.quant.int4 import fake_quant_int4

    served = fake_quant_int4(torch.randn(8, 64, generator=torch.Generator().manual_seed(1)), 32)
    expected = expected_held([("w", served)], ["torch.bfloat16", "torch.float32"])
    assert held_verdicts({"w": served.to(torch.bfloat16)}, expected) == {"w": "rounded"}
    assert held_verdicts({"w": served.clone()}, expected) == {"w": "equal"}


def test_check_held_counts_or_names_the_first_wrong_tensor():
    assert check_held({"a": "equal", "b": "rounded", "c": "rounded"}) == {"equal": 1, "rounded": 2, "wrong": 0}
    with pytest.raises(PushVerificationError, match=r"tensor 'b'.*\(2 of 3 tensors wrong\)"):
        check_held({"a": "equal", "c": "wrong", "b": "wrong"})
