"""Per-bucket integrity checksum, computed with torch on whatever device holds the bucket.

A weighted sum of 16 int64 lanes (wrapping arithmetic): one read pass, ~7-12 GB/s on one CPU
core here (zlib.crc32 measured 2.3 GB/s), GPU-native on CUDA. Any single changed 8-byte word
changes the result (odd weights are invertible mod 2**64), and so does moving data between lanes.
Not cryptographic: it guards against protocol bugs and corruption, not against an adversary.
"""

from __future__ import annotations

import torch

_LANES = 16
# Odd 63-bit constants, one per lane (fixed forever: both ends must agree).
_WEIGHTS = tuple(((0x9E3779B97F4A7C15 * (2 * i + 1)) & 0x7FFFFFFFFFFFFFFF) | 1 for i in range(_LANES))


_weights_by_device: dict[torch.device, torch.Tensor] = {}


def _weights(device: torch.device) -> torch.Tensor:
    if device not in _weights_by_device:
        _weights_by_device[device] = torch.tensor(_WEIGHTS, dtype=torch.int64, device=device)
    return _weights_by_device[device]


def bucket_checksum(region_u8: torch.Tensor) -> torch.Tensor:
    """Checksum of a uint8 region whose length is a multiple of 8 -> 0-dim int64 tensor (same device)."""
    nbytes = region_u8.numel()
    if nbytes % 8:
        raise ValueError(f"checksum region must be a multiple of 8 bytes, got {nbytes}")
    words = region_u8.view(torch.int64)
    full = words.numel() // _LANES * _LANES
    w = _weights(region_u8.device)
    acc = (words[:full].view(-1, _LANES).sum(0) * w).sum()
    tail = words[full:]
    return acc + (tail * w[: tail.numel()]).sum() + nbytes
