"""In-place weight updates of a live in-process vLLM engine (no disk, no rebuild).

The trainer's tensors arrive as `list[(name, tensor)]` in HF checkpoint naming. They are handed
to vLLM's worker through `LLM.collective_rpc` (with `VLLM_ENABLE_V1_MULTIPROCESSING=0` and the
"uni" executor the worker lives in this process, so tensors pass by reference), where the
model's own `load_weights` copies them (rounded to the engine dtype) into its parameters
(stacking q/k/v, gate/up, ...). On
CPU the packed GEMM copies are then rebuilt (see `k2post.rollout.vllm_cpu_patch`). Finally the
prefix cache is reset, since cached KV blocks were computed with the old weights.

    engine.load_weights(named_tensors)                      # VLLMEngine method
    rx = WeightReceiver(address, make_vllm_load_fn(engine))  # checkpoint_engine receiver side
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch

from k2post.rollout import vllm_cpu_patch

NamedTensors = list[tuple[str, torch.Tensor]]


class WeightUpdateError(RuntimeError):
    """A push could not be applied to the engine's model."""


def _worker_model(worker) -> torch.nn.Module:
    return worker.get_model() if hasattr(worker, "get_model") else worker.model_runner.model


def load_into_model(model: torch.nn.Module, named: Iterable[tuple[str, torch.Tensor]], repack: bool) -> int:
    """Copy HF-named tensors into a vLLM model in place. Returns how many tensors were given."""
    named = list(named)
    empty = vllm_cpu_patch.empty_cpu_linears(model) if repack else []
    if empty:
        raise WeightUpdateError(
            f"{len(empty)} CPU linear weights were emptied after loading (e.g. {empty[0]}): by the CPU GEMM "
            "dispatch (apply k2post.rollout.vllm_cpu_patch.apply_cpu_weight_patch() before building the "
            "engine) or by an attention backend that absorbs them (MLA): in-place pushes are unsupported there"
        )
    with torch.no_grad():
        model.load_weights(iter(named))  # the weight loaders copy: views may be reused afterwards
        if repack:
            vllm_cpu_patch.repack_cpu_linears(model)
    return len(named)


def cast_to_engine_dtype(named: NamedTensors, dtype: torch.dtype) -> NamedTensors:
    """Round floating tensors to the engine dtype first, as vLLM's checkpoint loader does.

    Needed where a parameter was widened after loading (the CPU bf16 GEMM keeps the bias in
    fp32): copying an fp32 trainer tensor straight in would skip the bf16 rounding.
    """
    return [(n, t.to(dtype) if t.is_floating_point() and t.dtype != dtype else t) for n, t in named]


def _rpc_load(worker, named: NamedTensors, repack: bool) -> int:
    """Runs inside the vLLM worker (`collective_rpc` passes the worker as first argument)."""
    named = cast_to_engine_dtype(named, worker.vllm_config.model_config.dtype)
    return load_into_model(_worker_model(worker), named, repack)


def push_weights(llm, named: NamedTensors, repack: bool) -> int:
    """Load `named` into every worker of a vLLM `LLM`, then reset its prefix cache."""
    counts = llm.collective_rpc(_rpc_load, args=(list(named), repack))
    llm.reset_prefix_cache()
    return int(counts[0]) if counts else 0


def make_vllm_load_fn(engine) -> Callable[[NamedTensors], None]:
    """A `checkpoint_engine.WeightReceiver` load callback that pushes each bucket into `engine`.

    The receiver's tensors are zero-copy views of its IPC buffer; the model's weight loaders
    copy them into the parameters before the callback returns, so the buffer may be reused.
    """

    def load(batch: NamedTensors) -> None:
        engine.load_weights(batch)

    return load


def model_state(llm) -> dict[str, torch.Tensor]:
    """A detached copy of the engine model's named parameters (for tests and debugging)."""

    def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
        return {name: p.detach().clone() for name, p in model.named_parameters()}

    return llm.apply_model(snapshot)[0]
