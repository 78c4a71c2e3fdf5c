"""In-place weight updates of a live in-process vLLM engine (no disk, no rebuild).

The trainer's tensors arrive as `list[(name, tensor)]` in HF checkpoint naming. They are handed
to vLLM's worker through `LLM.collective_rpc` and k2post's worker extension
(`k2post.rollout.worker_extension`; with `VLLM_ENABLE_V1_MULTIPROCESSING=0` and the "uni"
executor the worker lives in this process, so tensors pass by reference), where the
model's own `load_weights` copies them (rounded to each parameter's dtype) into its parameters
(stacking q/k/v, gate/up, experts, ...). On CPU the packed GEMM copies of linears and fused MoE
experts are then rebuilt (see `k2post.rollout.vllm_cpu_patch`). The caller resets the prefix cache
once the whole update is in (`VLLMEngine.weight_update()` does), since cached KV blocks were
computed with the old weights.

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


class PushVerificationError(WeightUpdateError):
    """After a push, the engine's weights are not the trainer's: a tensor skipped, swapped or changed."""


Cut = Callable[[torch.Tensor], torch.Tensor]  # full state-dict tensor -> one checkpoint tensor (a view)


def checkpoint_cuts(name: str, shape: tuple[int, ...]) -> list[tuple[str, Cut]]:
    """The HF checkpoint tensors that the state-dict entry `name` of `shape` is served as, each with the view that
    cuts it from the full tensor. transformers keeps MoE experts fused in 3-D parameters (`mlp.experts.gate_up_proj`
    [E, 2I, H], `mlp.experts.down_proj` [E, H, I]) that its checkpoints, and vLLM, name per expert
    (`mlp.experts.{e}.gate_proj.weight` [I, H], ...); every other entry is served whole under its own name."""
    if name.endswith("mlp.experts.gate_up_proj") and len(shape) == 3:
        prefix, half = name.removesuffix("gate_up_proj"), shape[1] // 2
        out: list[tuple[str, Cut]] = []
        for expert in range(shape[0]):
            out.append((f"{prefix}{expert}.gate_proj.weight", lambda t, e=expert: t[e, :half]))
            out.append((f"{prefix}{expert}.up_proj.weight", lambda t, e=expert: t[e, half:]))
        return out
    if name.endswith("mlp.experts.down_proj") and len(shape) == 3:
        prefix = name.removesuffix("down_proj")
        return [(f"{prefix}{expert}.down_proj.weight", lambda t, e=expert: t[e]) for expert in range(shape[0])]
    return [(name, lambda t: t)]


def unique_state_entries(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The state dict's live entries (`keep_vars`), a tensor under two names (tied embeddings) once, under its
    first name, as `save_pretrained` writes it."""
    seen: set[int] = set()
    out = []
    for name, value in model.state_dict(keep_vars=True).items():
        if id(value) not in seen:
            seen.add(id(value))
            out.append((name, value))
    return out


def checkpoint_named_tensors(model: torch.nn.Module, replace: dict[str, torch.Tensor] | None = None) -> NamedTensors:
    """The model's weights under its HF checkpoint names, which vLLM's `load_weights` takes (`checkpoint_cuts`:
    fused experts split into per-expert views, no copy); every other tensor of the state dict (parameters and
    persistent buffers such as the router's `e_score_correction_bias`) is passed as it is. `replace` gives other
    values for some state-dict names (INT4 QAT: the fake-quant weights the trainer's forward uses). A tensor under
    two names (tied embeddings: `lm_head.weight` is `model.embed_tokens.weight`) is served once, under its first
    name, as `save_pretrained` writes it: vLLM's `load_weights` raises on a tied alias without its target in the
    same call, and a push sends the model bucket by bucket."""
    out: NamedTensors = []
    replace = replace or {}
    for name, value in unique_state_entries(model):
        tensor = replace[name] if name in replace else value.data
        out.extend((served, cut(tensor)) for served, cut in checkpoint_cuts(name, tuple(tensor.shape)))
    return out


def tensor_digests(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, str]:
    """Name -> xxh3-64 digest of each tensor's bytes (what the post-push verification compares)."""
    from k2post_checkpoint_engine.checksum import piece_digest

    return {name: piece_digest(tensor) for name, tensor in named}


def unwritten_parameters(model: torch.nn.Module, loaded: set[str]) -> list[str]:
    """The model's parameters (vLLM names) that no loaded tensor wrote."""
    return sorted(name for name, _ in model.named_parameters() if name not in loaded)


def compare_digests(trainer: dict[str, str], engine: dict[str, str]) -> None:
    """PushVerificationError naming the first tensor the engine did not get as the trainer has it."""
    missing = [name for name in trainer if name not in engine]
    if missing:
        raise PushVerificationError(f"the engine never received {missing[0]!r} ({len(missing)} tensors missing)")
    extra = [name for name in engine if name not in trainer]
    if extra:
        raise PushVerificationError(f"the engine received {extra[0]!r}, which the trainer does not have")
    for name, digest in trainer.items():
        if engine[name] != digest:
            raise PushVerificationError(
                f"tensor {name!r}: the engine loaded digest {engine[name]}, the trainer has {digest} "
                "(swapped, stale or corrupted on the way)"
            )


def worker_model(worker) -> torch.nn.Module:
    """The model inside a vLLM worker (v1 workers expose get_model())."""
    return worker.get_model() if hasattr(worker, "get_model") else worker.model_runner.model


ABSORBED_MLA_ATTRS = ("W_UK_T", "W_UV")  # set by vLLM MLA backends in process_weights_after_loading


def in_place_problems(model: torch.nn.Module, cpu: bool) -> list[str]:
    """Why in-place pushes cannot work on this built model (empty list: they can)."""
    if not cpu:
        return []
    problems = []
    empty = vllm_cpu_patch.empty_cpu_linears(model)
    if empty:
        problems.append(
            f"{len(empty)} CPU linear weights were emptied after loading (e.g. {empty[0]}): by the CPU GEMM "
            "dispatch (apply k2post.rollout.vllm_cpu_patch.apply_cpu_weight_patch() before building the "
            "engine) or by an MLA attention backend that absorbs kv_b_proj (build with disable_mla: true)"
        )
    absorbed = [
        name
        for name, module in model.named_modules()
        if any(isinstance(getattr(module, attr, None), torch.Tensor) for attr in ABSORBED_MLA_ATTRS)
    ]
    if absorbed:
        problems.append(
            f"{len(absorbed)} MLA attention layers keep kv_b_proj absorbed into W_UK_T/W_UV copies "
            f"(e.g. {absorbed[0]}; the AMX MLA backend on CPUs with AMX): a push into kv_b_proj would not reach them "
            "(build with disable_mla: true)"
        )
    packed = vllm_cpu_patch.packed_experts_without_copy(model)
    if packed:
        problems.append(
            f"{len(packed)} CPU-packed MoE layers keep no unpacked copy (e.g. {packed[0]}): apply "
            "k2post.rollout.vllm_cpu_patch.apply_cpu_moe_patch() before building the engine"
        )
    return problems


def load_into_model(
    model: torch.nn.Module, named: Iterable[tuple[str, torch.Tensor]], repack: bool, loaded: set[str] | None = None
) -> int:
    """Copy HF-named tensors into a vLLM model in place. Returns how many tensors were given; `loaded` collects
    the vLLM parameter names the model's `load_weights` reports it wrote."""
    named = list(named)
    problems = in_place_problems(model, cpu=repack)
    if problems:
        raise WeightUpdateError("in-place push unsupported: " + "; ".join(problems))
    experts = vllm_cpu_patch.unpacked_expert_layers(model, [n for n, _ in named]) if repack else []
    vllm_cpu_patch.swap_in_unpacked_experts(experts)
    try:
        with torch.no_grad():
            written = model.load_weights(iter(named))  # the weight loaders copy: views may be reused afterwards
        if loaded is not None and written is not None:
            loaded.update(written)
    finally:
        if repack:  # also after a failed load: never leave plain-layout tensors where packed ones belong
            vllm_cpu_patch.repack_cpu_experts(experts)
    if repack:
        vllm_cpu_patch.round_widened_params(model)
        # only the linears this call wrote (a push calls once per bucket); all of them when the model does not say
        params = dict(model.named_parameters())
        touched = None if written is None else [params[name] for name in written if name in params]
        vllm_cpu_patch.repack_cpu_linears(model, touched)
    return len(named)


def engine_in_place_problems(llm, cpu: bool) -> list[str]:
    """`in_place_problems` of the model inside a vLLM `LLM` (through the k2post worker extension)."""
    return list(llm.collective_rpc("k2post_in_place_problems", args=(cpu,))[0])


def push_weights(llm, named: NamedTensors, repack: bool) -> int:
    """Load `named` into every worker of a vLLM `LLM` (the caller resets the prefix cache).

    Tensors are copied in as they come: each weight loader's `copy_` rounds them to the
    parameter's dtype, exactly as loading a checkpoint with those tensors would."""
    counts = llm.collective_rpc("k2post_load_weights", args=(list(named), repack))
    return int(counts[0]) if counts else 0


def make_vllm_load_fn(engine) -> Callable[[NamedTensors], None]:
    """A `checkpoint_engine.WeightReceiver` load callback that pushes each bucket into `engine`.

    The receiver's tensors are zero-copy views of its IPC buffer; they are copied (into the
    model, or into the rebuild staging state) before the callback returns, so the buffer may be
    reused. Wrap the receive in `engine.weight_update()` so the update is applied as one.
    """

    def load(batch: NamedTensors) -> None:
        engine.load_weights(batch)

    return load


def model_state(llm) -> dict[str, torch.Tensor]:
    """A detached copy of the engine model's named parameters (for tests and debugging)."""

    def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
        return {name: p.detach().clone() for name, p in model.named_parameters()}

    return llm.apply_model(snapshot)[0]
