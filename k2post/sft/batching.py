"""Which packed rows every rank trains on at every step: a pure function of (seed, step).

Epoch e shuffles the train examples with `Random(f"{seed}:{e}")`, packs them
(`packing.pack_examples`) and the epochs' rows form one endless stream. Step s takes the next
`micro_batch_size * gradient_accumulation_steps * world_size` rows of the stream, cut into
micro-batches; rank r gets micro-batches [r * gas, (r + 1) * gas). Nothing depends on
iteration state, so a resumed run at step s sees exactly the rows the uninterrupted run saw,
and every rank knows the step's total label tokens (used to normalize the loss exactly: the
gradient is that of the token-mean loss over the whole global batch).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from k2post.sft.packing import Example, PackedRow, pack_examples


@dataclass(frozen=True)
class BatchShape:
    """How many packed rows one step takes, and how they are split."""

    micro_batch_size: int
    gradient_accumulation_steps: int
    world_size: int = 1

    @property
    def micro_batches_per_step(self) -> int:
        """Micro-batches of one optimizer step over all ranks."""
        return self.gradient_accumulation_steps * self.world_size

    @property
    def rows_per_step(self) -> int:
        """Packed rows of one optimizer step over all ranks."""
        return self.micro_batch_size * self.micro_batches_per_step


class BatchPlan:
    """The deterministic stream of packed train rows, read by step."""

    def __init__(
        self, examples: Sequence[Example], max_seq_len: int, shape: BatchShape, seed: int = 0, packing: bool = True
    ) -> None:
        if not examples:
            raise ValueError("BatchPlan needs at least one train example")
        self.examples, self.max_seq_len, self.shape = list(examples), max_seq_len, shape
        self.seed, self.packing = seed, packing
        self._epochs: OrderedDict[int, list[PackedRow]] = OrderedDict()  # the two most recently used epochs
        self._lengths: dict[int, int] = {}  # rows per epoch, kept for every epoch seen

    def epoch_rows(self, epoch: int) -> list[PackedRow]:
        """The packed rows of `epoch` (its own shuffle of the examples)."""
        if epoch not in self._epochs:
            order = list(range(len(self.examples)))
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
            self._epochs[epoch] = pack_examples([self.examples[i] for i in order], self.max_seq_len, self.packing)
            self._lengths[epoch] = len(self._epochs[epoch])
        self._epochs.move_to_end(epoch)
        while len(self._epochs) > 2:
            self._epochs.popitem(last=False)  # least recently used
        return self._epochs[epoch]

    def epoch_length(self, epoch: int) -> int:
        """Packed rows in `epoch`."""
        if epoch not in self._lengths:
            self.epoch_rows(epoch)
        return self._lengths[epoch]

    def _locate(self, position: int) -> tuple[int, int]:
        """(epoch, offset) of row `position` of the endless stream."""
        epoch = 0
        while position >= self.epoch_length(epoch):
            position -= self.epoch_length(epoch)
            epoch += 1
        return epoch, position

    def steps_for_epochs(self, epochs: int) -> int:
        """Steps that cover `epochs` passes over the rows (rounded up), counted with epoch 0's row count."""
        return max(1, math.ceil(epochs * self.epoch_length(0) / self.shape.rows_per_step))

    def _rows(self, start: int, count: int) -> list[PackedRow]:
        """Rows [start, start + count) of the endless stream."""
        out: list[PackedRow] = []
        epoch, offset = self._locate(start)
        while len(out) < count:
            rows = self.epoch_rows(epoch)
            out.extend(rows[offset : offset + count - len(out)])
            epoch, offset = epoch + 1, 0
        return out

    def epoch_of_step(self, step: int) -> float:
        """Fractional epoch at the start of `step` (for logs)."""
        epoch, offset = self._locate(step * self.shape.rows_per_step)
        return epoch + offset / self.epoch_length(epoch)

    def step_micro_batches(self, step: int) -> list[list[PackedRow]]:
        """All micro-batches of `step` over all ranks (rank r's are [r * gas, (r + 1) * gas))."""
        size = self.shape.micro_batch_size
        rows = self._rows(step * self.shape.rows_per_step, self.shape.rows_per_step)
        return [rows[i : i + size] for i in range(0, len(rows), size)]

    def rank_micro_batches(self, step: int, rank: int) -> list[list[PackedRow]]:
        """The micro-batches `rank` trains on at `step`."""
        gas = self.shape.gradient_accumulation_steps
        return self.step_micro_batches(step)[rank * gas : (rank + 1) * gas]

    def step_label_tokens(self, step: int) -> int:
        """Label tokens of `step` over all ranks (the loss normalizer)."""
        return sum(row.num_label_tokens for batch in self.step_micro_batches(step) for row in batch)

    def fingerprint(self) -> str:
        """Hash of everything that decides the stream (examples, packing, shape, seed): resume checks it."""
        digest = hashlib.sha256()
        for example in self.examples:
            digest.update(f"{example.id}:{len(example)}:{example.num_label_tokens};".encode())
        digest.update(f"{self.max_seq_len}:{self.packing}:{self.shape}:{self.seed}".encode())
        return digest.hexdigest()[:16]
