"""INT4 weight-only quantization as K2 Thinking trains and ships it (W4A16, MoE expert weights only; docs/QAT.md).

Per group of `group_size` consecutive weights along the input dimension (the last dim of a weight; transformers'
fused 3-D experts are [experts, out, in]): symmetric, scale = amax / 7, q = round(w / scale) clamped to [-7, 7],
dequantized w_hat = q * scale. A group of zeros gets scale 0 and stays 0.

    q_int8, scale = quantize_int4(w, 32)             # [..., out, in] int8 in [-7, 7], [..., out, in / 32]
    w_hat = dequantize_int4(q_int8, scale, 32)       # == fake_quant_int4(w, 32), bit for bit
    w_ste = fake_quant_ste(w, 32)                    # w_hat in the forward, identity gradient (straight-through)
    packed = pack_int4(q_int8)                       # int32 [..., out, in / 8]: 8 values per word, low nibble first
    q_back = unpack_int4(packed, in_features)        # == q_int8

Packing is compressed-tensors' "pack-quantized" layout (the format K2 Thinking ships): each value offset by +8 to
an unsigned nibble, value j of a word in bits 4j..4j+3. Tested against a hand table and, independently, against
the `compressed_tensors` package's own unpacker (tests/k2post/quant/test_int4.py).
"""

from __future__ import annotations

import torch

QMAX = 7  # symmetric INT4 without -8: q in [-7, 7]
PACK = 8  # 4-bit values per int32 word


def _grouped(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """[..., in] -> [..., in / group_size, group_size] (a view)."""
    if weight.dim() < 2:
        raise ValueError(f"INT4 quantizes weight matrices, got a tensor of shape {tuple(weight.shape)}")
    if weight.shape[-1] % group_size:
        raise ValueError(
            f"input dimension {weight.shape[-1]} of a {tuple(weight.shape)} weight is not a multiple of the "
            f"group size {group_size}: pick a group_size that divides it"
        )
    return weight.reshape(*weight.shape[:-1], weight.shape[-1] // group_size, group_size)


def group_scales(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """amax / 7 per group (fp32). [..., in] -> [..., in / group_size]."""
    return _grouped(weight.detach().float(), group_size).abs().amax(dim=-1) / QMAX


def quantize_int4(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 in [-7, 7] shaped like `weight`, fp32 scales [..., in / group_size])."""
    scale = group_scales(weight, group_size)
    grouped = _grouped(weight.detach().float(), group_size)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))[..., None]
    q = torch.clamp(torch.round(grouped / safe), -QMAX, QMAX)
    return q.to(torch.int8).reshape(weight.shape), scale


def dequantize_int4(q: torch.Tensor, scale: torch.Tensor, group_size: int, dtype=torch.float32) -> torch.Tensor:
    """q * scale per group, in `dtype`. [..., in] int8, [..., in / group_size] -> [..., in]."""
    grouped = _grouped(q, group_size).float() * scale.float()[..., None]
    return grouped.reshape(q.shape).to(dtype)


def fake_quant_int4(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """The INT4 round trip of `weight` (same shape and dtype), no gradient."""
    q, scale = quantize_int4(weight, group_size)
    return dequantize_int4(q, scale, group_size, weight.dtype)


def fake_quant_ste(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """`fake_quant_int4(weight)` in the forward; in the backward the gradient passes to `weight` unchanged."""
    return weight + (fake_quant_int4(weight, group_size) - weight).detach()


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """int8 values in [-8, 7] -> int32 words along the last dim (8 per word; value j in bits 4j..4j+3, offset +8).
    [..., in] -> [..., ceil(in / 8)] (the last word zero-padded)."""
    if q.dtype != torch.int8:
        raise ValueError(f"pack_int4 takes int8 values, got {q.dtype}")
    width = -(-q.shape[-1] // PACK) * PACK
    nibbles = (q.to(torch.int32) + 8) & 0xF
    nibbles = torch.nn.functional.pad(nibbles, (0, width - q.shape[-1]))
    words = nibbles.reshape(*q.shape[:-1], width // PACK, PACK)
    shifts = torch.arange(PACK, dtype=torch.int64, device=q.device) * 4
    return _to_int32((words.to(torch.int64) << shifts).sum(dim=-1))


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    """uint32 values held in int64 -> the int32 with the same bits."""
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


def unpack_int4(packed: torch.Tensor, size: int) -> torch.Tensor:
    """Inverse of `pack_int4`: int32 words -> int8 values in [-8, 7], the last dim cut to `size`."""
    if packed.dtype != torch.int32:
        raise ValueError(f"unpack_int4 takes int32 words, got {packed.dtype}")
    shifts = torch.arange(PACK, dtype=torch.int64, device=packed.device) * 4
    words = packed.to(torch.int64) & 0xFFFFFFFF
    nibbles = (words[..., None] >> shifts) & 0xF  # [..., words, 8]
    values = nibbles.reshape(*packed.shape[:-1], packed.shape[-1] * PACK)[..., :size]
    return (values - 8).to(torch.int8)
