"""INT4 weight-only quantization (k2post/quant/int4.py): tables, the straight-through gradient, packing checked by
hand and against the compressed-tensors package's own unpacker."""

from __future__ import annotations

import pytest
import torch

from k2post.quant.int4 import (
    dequantize_int4,
    fake_quant_int4,
    fake_quant_ste,
    group_scales,
    pack_int4,
    quantize_int4,
    unpack_int4,
)


@pytest.mark.parametrize(
    ("row", "q"),
    [
        ([7.0, -7.0, 3.4, 0.5], [7, -7, 3, 0]),  # scale 1; round half to even: 0.5 -> 0
        ([1.4, 0.0, -0.2, 0.7], [7, 0, -1, 4]),  # scale 0.2: 0.7 / 0.2 = 3.5 -> 4, -0.2 / 0.2 = -1
        ([0.0, 0.0, 0.0, 0.0], [0, 0, 0, 0]),  # a group of zeros: scale 0, stays zero
    ],
)
def test_quantize_int4_table(row, q):
    got_q, got_scale = quantize_int4(torch.tensor([row]), group_size=4)
    assert got_q.tolist() == [q] and got_q.dtype == torch.int8
    torch.testing.assert_close(got_scale, torch.tensor([[max(abs(v) for v in row) / 7]]))


def test_groups_run_along_the_input_dimension_and_3d_experts_work():
    weight = torch.randn(3, 4, 64)  # [experts, out, in]
    scale = group_scales(weight, 32)
    assert scale.shape == (3, 4, 2)
    torch.testing.assert_close(scale[1, 2, 1], weight[1, 2, 32:].abs().max() / 7)
    q, _ = quantize_int4(weight, 32)
    assert q.abs().max() <= 7 and (q.abs() == 7).any()
    w_hat = fake_quant_int4(weight, 32)
    assert torch.equal(w_hat, dequantize_int4(q, scale, 32))
    assert (w_hat - weight).abs().max() <= scale.max() / 2 + 1e-6  # rounding error at most half a step
    assert torch.equal(fake_quant_int4(w_hat, 32), w_hat)  # idempotent


def test_fake_quant_ste_forward_is_quantized_and_gradient_passes_straight_through():
    weight = torch.randn(4, 32, requires_grad=True)
    out = fake_quant_ste(weight, 32)
    assert torch.equal(out.detach(), fake_quant_int4(weight.detach(), 32))
    (out * torch.arange(128.0).reshape(4, 32)).sum().backward()
    assert torch.equal(weight.grad, torch.arange(128.0).reshape(4, 32))


def test_bad_shapes_are_one_line_errors():
    with pytest.raises(ValueError, match="not a multiple of the group size 32"):
        quantize_int4(torch.zeros(2, 48), 32)
    with pytest.raises(ValueError, match="weight matrices"):
        quantize_int4(torch.zeros(32), 32)


def test_pack_layout_by_hand():
    q = torch.tensor([[-8, -7, 0, 1, 2, 3, 6, 7, 5]], dtype=torch.int8)
    packed = pack_int4(q)
    nibbles = [0, 1, 8, 9, 10, 11, 14, 15]
    first = sum(n << (4 * j) for j, n in enumerate(nibbles))
    assert packed.dtype == torch.int32 and packed.shape == (1, 2)
    assert packed[0, 0].item() == first - (1 << 32)  # bit 31 set: a negative int32
    assert packed[0, 1].item() == 13  # 5 + 8; the padding nibbles are 0 (cut off again by unpack)
    assert torch.equal(unpack_int4(packed, 9), q)


def test_pack_round_trip_and_compressed_tensors_reads_it():
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    q, _ = quantize_int4(torch.randn(2, 16, 96), 32)
    packed = pack_int4(q)
    assert torch.equal(unpack_int4(packed, 96), q)
    theirs = unpack_from_int32(packed[0], 4, torch.Size([16, 96]))
    assert torch.equal(theirs.to(torch.int8), q[0])
