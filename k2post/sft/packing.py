"""Sequence packing for SFT: pure functions from tokenized examples to model-ready rows.

- `pack_bins(lengths, capacity)`: greedy best-fit in arrival order - each example goes into
  the open row with the least room that still fits it, else opens a new row. Rows keep their
  examples in arrival order. An example longer than `capacity` is an error (never truncated).
- `build_row(examples)`: one packed row. `labels[i] = input_ids[i]` where the example's loss
  mask is 1, else -100 (HF convention: the model shifts labels, so logits at i-1 predict
  token i). The first token of every example is -100 too, so no token is ever predicted
  from the previous example. `position_ids` restart at 0 for every example.
- `collate(rows, pad_id)`: a batch of rows padded to the longest; padding is its own block
  (positions restart at 0, labels -100) so it never touches real tokens.

Attention boundaries: with `attention_mask=None` and these `position_ids`, transformers
(5.x, `masking_utils.find_packed_sequence_indices`) turns every restart of the positions into a
new block of a block-causal mask, for sdpa/eager and for k2post's QK-Clip recording attention
(it registers the same mask builders). That detection is skipped when a KV cache is passed:
call the model with `use_cache=False` (`model_inputs` does). `check_packed_attention` verifies
it for a given model; tests/k2post/sft/test_packing.py checks packed logits == per-example
logits for tiny-qwen2 and tiny-k2.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

IGNORE_INDEX = -100


@dataclass(frozen=True)
class Example:
    """One tokenized dialogue: ids, loss mask (1 = train on this token), and where it came from."""

    input_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    row_index: int = -1
    id: str = ""

    def __post_init__(self) -> None:
        if len(self.input_ids) != len(self.loss_mask) or not self.input_ids:
            raise ValueError(
                f"example {self.id or self.row_index}: {len(self.input_ids)} ids vs {len(self.loss_mask)} mask "
                "entries (need the same, non-zero length)"
            )

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_label_tokens(self) -> int:
        """Tokens that carry a label (mask 1, except the example's first token)."""
        return sum(self.loss_mask[1:])


@dataclass(frozen=True)
class PackedRow:
    """Several examples in one row: ids, labels (-100 = no loss), positions restarting per example."""

    input_ids: list[int]
    labels: list[int]
    position_ids: list[int]
    example_ids: tuple[str, ...]
    lengths: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_label_tokens(self) -> int:
        """Tokens whose prediction is trained on."""
        return sum(1 for label in self.labels if label != IGNORE_INDEX)


def pack_bins(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Indices of `lengths` grouped into rows of at most `capacity` tokens (greedy best-fit, arrival order)."""
    if capacity <= 0:
        raise ValueError(f"capacity must be positive, got {capacity}")
    bins: list[list[int]] = []
    free: list[tuple[int, int]] = []  # sorted (room left, bin index)
    for index, length in enumerate(lengths):
        if not 0 < length <= capacity:
            raise ValueError(f"example {index} has {length} tokens; rows hold 1..{capacity} (never truncated)")
        slot = bisect.bisect_left(free, (length, -1))
        if slot < len(free):
            room, chosen = free.pop(slot)
        else:
            room, chosen = capacity, len(bins)
            bins.append([])
        bins[chosen].append(index)
        if room - length > 0:
            bisect.insort(free, (room - length, chosen))
    return bins


def example_labels(example: Example) -> list[int]:
    """Labels of one example: its id where the mask is 1, -100 elsewhere and at its first token."""
    labels = [tok if bit else IGNORE_INDEX for tok, bit in zip(example.input_ids, example.loss_mask)]
    labels[0] = IGNORE_INDEX
    return labels


def build_row(examples: Sequence[Example]) -> PackedRow:
    """Concatenate examples into one packed row (labels and positions per example)."""
    if not examples:
        raise ValueError("a packed row needs at least one example")
    ids: list[int] = []
    labels: list[int] = []
    positions: list[int] = []
    for example in examples:
        ids.extend(example.input_ids)
        labels.extend(example_labels(example))
        positions.extend(range(len(example)))
    return PackedRow(ids, labels, positions, tuple(e.id for e in examples), tuple(len(e) for e in examples))


def pack_examples(examples: Sequence[Example], max_seq_len: int, packing: bool = True) -> list[PackedRow]:
    """Packed rows of at most `max_seq_len` tokens (one example per row when `packing` is False)."""
    if not packing:
        return [build_row([example]) for example in examples]
    bins = pack_bins([len(example) for example in examples], max_seq_len)
    return [build_row([examples[i] for i in group]) for group in bins]


def collate(rows: Sequence[PackedRow], pad_id: int) -> dict[str, Any]:
    """Tensors [B, L] (input_ids, labels, position_ids; token_valid: bool, False on padding) of rows
    padded to the longest row. The padding is a block of its own for attention; QK-Clip's recorder
    must skip it (`recording_real_tokens(recorder, batch["token_valid"])`)."""
    import torch

    width = max(len(row) for row in rows)
    ids, labels, positions, valid = [], [], [], []
    for row in rows:
        pad = width - len(row)
        ids.append(row.input_ids + [pad_id] * pad)
        labels.append(row.labels + [IGNORE_INDEX] * pad)
        positions.append(row.position_ids + list(range(pad)))  # padding = its own block
        valid.append([True] * len(row) + [False] * pad)
    return {
        "input_ids": torch.tensor(ids, dtype=torch.long),
        "labels": torch.tensor(labels, dtype=torch.long),
        "position_ids": torch.tensor(positions, dtype=torch.long),
        "token_valid": torch.tensor(valid, dtype=torch.bool),
    }


def model_inputs(batch: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments of a packed forward: no attention mask, positions given, no KV cache."""
    return {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"], "use_cache": False}


VERIFIED_BY_MASK = ("sdpa", "eager", "k2post_sdpa_maxlogit", "k2post_eager_maxlogit")


def check_packed_attention(model: Any) -> None:
    """Raise if `model`'s attention would let packed examples see each other.

    For mask-based implementations (sdpa, eager, the QK-Clip recording twins) build the mask
    transformers makes from restarting position_ids and check it is block-causal. Flash
    attention implementations read the restarts from position_ids themselves (varlen).
    """
    impl = model.config._attn_implementation
    if "flash" in str(impl):
        return
    if impl not in VERIFIED_BY_MASK:
        raise ValueError(
            f"packing is not verified for attention implementation {impl!r} (verified: {VERIFIED_BY_MASK}, flash): "
            "set data.packing: false"
        )
    allowed = _packed_mask(model)
    expected = _block_causal([3, 2])
    if allowed is None or not bool((allowed == expected).all()):
        raise ValueError(
            f"{impl!r} attention does not build a block-causal mask from position_ids: set data.packing: false"
        )


def _packed_mask(model: Any) -> Any:
    """The bool 'may attend' mask [5, 5] transformers builds for positions [0, 1, 2, 0, 1], or None."""
    import torch
    from transformers.masking_utils import create_causal_mask

    embeds = torch.zeros(1, 5, 1, dtype=torch.float32)
    mask = create_causal_mask(model.config, embeds, None, None, position_ids=torch.tensor([[0, 1, 2, 0, 1]]))
    if mask is None:
        return None
    mask = mask[0, 0]
    return mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2


def _block_causal(lengths: Sequence[int]) -> Any:
    """The expected bool mask: causal inside each block, nothing across blocks."""
    import torch

    total = sum(lengths)
    block = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    causal = torch.ones(total, total, dtype=torch.bool).tril()
    return causal & (block[:, None] == block[None, :])
