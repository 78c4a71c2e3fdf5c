"""Per-piece digests of a push: xxh3-64 of each tensor piece's bytes, bound to the piece by its place in the plan.

The owner rank hashes each piece from its *source* tensor (cast to the wire dtype), not from the bucket it
wrote, and sends the list with the bucket; the receiver hashes the bytes it finds at each piece's offset.
So every way the bytes can end up wrong is caught and named: a flipped or torn byte in the IPC buffer, two
same-shape tensors written to each other's offsets, a piece moved by any number of bytes, a stale bucket —
`tensor 'w' (bucket 3, bytes 0..4096): digest 1f.. != sender's 9a..`. (The lane-sum checksum this replaces
missed swaps and moves by multiples of 128 bytes.) Not cryptographic: it guards against bugs and
corruption, not an adversary. CUDA pieces are copied to the host to be hashed: what `verify_checksum`
costs on GPU is that copy (measured in benchmarks/weight_sync.py).
"""

from __future__ import annotations

import torch
import xxhash


def piece_digest(piece: torch.Tensor) -> str:
    """xxh3-64 hex digest of a tensor's bytes (any dtype; contiguous or not; any device)."""
    flat = piece.detach().reshape(-1)
    if flat.device.type != "cpu":
        flat = flat.cpu()
    raw = flat.contiguous().view(torch.uint8)
    return xxhash.xxh3_64_hexdigest(raw.numpy())


def source_piece(source: torch.Tensor, start: int, numel: int, wire_dtype: torch.dtype) -> torch.Tensor:
    """Elements [start, start + numel) of `source` as they travel (cast to `wire_dtype`)."""
    piece = source.reshape(-1)[start : start + numel]
    return piece if piece.dtype == wire_dtype else piece.to(wire_dtype)
