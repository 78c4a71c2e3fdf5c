"""What an RL trainer rank registers with its checkpoint-engine sender: the weights the engines serve.

The engines load HF checkpoint names (`k2post.rollout.weight_update.checkpoint_cuts`: fused MoE experts split per
expert), with QAT targets as their INT4 round trip (the values the trainer's forward used).

- ZeRO 0-2: every rank holds the full module parameters; they are registered live (`served_tensors`), owned by
  rank 0, which copies them into the buckets and broadcasts. With LoRA they are the merged weights W + (alpha/r) B A
  (`k2post.train.lora`), computed when the push opens.
- ZeRO-3: each rank holds 1/R of each parameter. Every served tensor is a *collective materializer*
  (`zero3_sources`): during a push, all ranks reach it at the same point of the bucket plan and gather its
  parameter (`deepspeed.zero.GatheredParameters`), the owner copies the cut into the bucket, and the parameter is
  released after its last cut. So the push holds one gathered parameter (all experts of a fused MoE parameter at
  most) and the two buckets at a time, never the whole model. Each rank records the digest of every tensor it
  materialized, which the post-push verification compares with what its engine loaded.
Tied weights are served once, under their first name (vLLM refuses a tied alias without its target).

    sources, whole = zero3_sources(engine.module, qat_names, group_size)
    for s in sources: sender.register(s.name, s.materialize, shape=s.shape, dtype=s.dtype, collective=True)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from k2post.quant.config import QATConfig
from k2post.rollout.weight_update import Cut, checkpoint_cuts, checkpoint_named_tensors, unique_state_entries

NamedTensors = list[tuple[str, torch.Tensor]]
Transform = Callable[[torch.Tensor], torch.Tensor]


def served_tensors(module: torch.nn.Module, qat: QATConfig, lora: bool = False) -> NamedTensors:
    """ZeRO 0-2: the served tensors as live views of the module's full parameters (QAT targets quantized); with
    LoRA, the base weights with the adapters merged in (`k2post.train.lora.merged_named_tensors`)."""
    from k2post.quant.qat import quantized_weights

    if lora:
        from k2post.train.lora import merged_named_tensors

        return merged_named_tensors(module)
    return checkpoint_named_tensors(module, replace=quantized_weights(module, qat))


def is_partitioned(param: torch.Tensor) -> bool:
    """A ZeRO-3 parameter (its full shape in `ds_shape`; `.data` is empty outside a gather)."""
    return hasattr(param, "ds_shape")


def full_shape(param: torch.Tensor) -> tuple[int, ...]:
    """The parameter's full shape, partitioned or not."""
    return tuple(param.ds_shape) if is_partitioned(param) else tuple(param.shape)


def full_numel(param: torch.Tensor) -> int:
    """The parameter's full element count, partitioned or not."""
    return int(param.ds_numel) if is_partitioned(param) else param.numel()


class GatheredParam:
    """One ZeRO-3 parameter gathered once for all the served tensors cut from it.

    `open()` gathers on first use (collective: every rank calls it at the same point of the plan) and applies
    `transform` (QAT); `close()` is called once per cut and releases the gather after the last one."""

    def __init__(self, param: torch.Tensor, n_cuts: int, transform: Transform | None) -> None:
        self.param, self.n_cuts, self.transform = param, n_cuts, transform
        self._stack: contextlib.ExitStack | None = None
        self._full: torch.Tensor | None = None
        self._closed = 0

    def open(self) -> torch.Tensor:
        if self._full is None:
            import deepspeed

            self._stack = contextlib.ExitStack()
            self._stack.enter_context(deepspeed.zero.GatheredParameters([self.param], modifier_rank=None))
            data = self.param.data
            self._full = self.transform(data) if self.transform is not None else data
        return self._full

    def close(self) -> None:
        self._closed += 1
        if self._closed == self.n_cuts:
            self._full, self._closed = None, 0
            if self._stack is not None:
                self._stack.close()
                self._stack = None


@dataclass
class ServedSource:
    """One served tensor of a ZeRO-3 rank: its checkpoint name, full shape, dtype and materializer."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    gathered: GatheredParam
    cut: Cut
    digests: dict[str, str] | None = None  # set by the trainer for a verified push

    @contextlib.contextmanager
    def materialize(self) -> Iterator[torch.Tensor]:
        tensor = self.cut(self.gathered.open())
        try:
            if self.digests is not None:
                from k2post_checkpoint_engine.checksum import piece_digest

                self.digests[self.name] = piece_digest(tensor)
            yield tensor
        finally:
            self.gathered.close()


def _cut_shape(cut: Cut, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[int, ...]:
    """The shape `cut` gives on a tensor of `shape` (computed on the meta device: no memory)."""
    return tuple(cut(torch.empty(shape, dtype=dtype, device="meta")).shape)


def zero3_sources(
    module: torch.nn.Module, qat_names: set[str], group_size: int
) -> tuple[list[ServedSource], NamedTensors]:
    """ZeRO-3: (a collective materializer per served parameter cut, the module's buffers as full tensors).

    `qat_names`: state-dict names of the QAT targets (`install_qat`'s result, taken before DeepSpeed partitioned
    the weights), served as their INT4 round trip with `group_size`. Buffers (e.g. the router's
    `e_score_correction_bias`) and parameters below DeepSpeed's persistence threshold are not partitioned and are
    registered as they are. A parameter is gathered once for all its cuts (the experts of a fused MoE parameter)."""
    from k2post.quant.int4 import fake_quant_int4

    params = dict(module.named_parameters(remove_duplicate=False))
    sources: list[ServedSource] = []
    whole: NamedTensors = []
    for name, value in unique_state_entries(module):
        if name not in params or not is_partitioned(value):
            whole.extend((served, cut(value.data)) for served, cut in checkpoint_cuts(name, tuple(value.shape)))
            continue
        shape = full_shape(value)
        cuts = checkpoint_cuts(name, shape)
        transform = (lambda t: fake_quant_int4(t, group_size)) if name in qat_names else None
        gathered = GatheredParam(value, len(cuts), transform)
        for served, cut in cuts:
            sources.append(ServedSource(served, _cut_shape(cut, shape, value.dtype), value.dtype, gathered, cut))
    return sources, whole
