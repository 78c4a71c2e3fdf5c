"""INT4 quantization-aware training: the trainer's forward sees the INT4 round trip of the chosen weights.

`install_qat(model, cfg)` wraps the forward of every module whose name matches `cfg.modules` (fnmatch; default:
the routed MoE experts, `*.mlp.experts`): during that forward each of the module's floating-point weights of
2+ dims is `fake_quant_ste(weight, cfg.group_size)` — INT4 values in the forward, the gradient straight through
to the full-precision weight the optimizer (MuonClip) keeps. Parameters stay where and what they are (names,
ZeRO partitions, optimizer state), so QAT composes with DeepSpeed ZeRO 0-3 and Muon: inside the forward, after
DeepSpeed's pre-forward hooks have gathered them, the wrapper swaps each target for its fake-quant tensor and
puts the Parameter back when the forward returns.

    targets = install_qat(model, QATConfig(enabled=True))     # {module name: [param names]}
    served = quantized_weights(model, cfg)                    # {state-dict name: w_hat}: what the engine gets

The rollout engine must serve what the forward used: the trainer pushes `quantized_weights` in place of the
targeted weights (`k2post.rollout.weight_update.checkpoint_named_tensors(model, replace=...)`).
"""

from __future__ import annotations

import fnmatch
import types
from typing import Any

import torch

from k2post.quant.config import QATConfig
from k2post.quant.int4 import fake_quant_int4, fake_quant_ste

__all__ = ["QATConfig", "QATError", "install_qat", "qat_targets", "quantized_weights"]


class QATError(ValueError):
    """The QAT config does not fit the model (no module matched, a weight the group size does not divide)."""


def qat_targets(model: torch.nn.Module, cfg: QATConfig) -> dict[str, list[str]]:
    """{module name: names of its quantized parameters} for every module matching `cfg.modules`."""
    targets = {}
    for name, module in model.named_modules():
        if not any(fnmatch.fnmatch(name, pattern) for pattern in cfg.modules):
            continue
        params = [n for n, p in module.named_parameters(recurse=False) if p.dim() >= 2 and p.is_floating_point()]
        for param_name in params:
            size = getattr(module, param_name).shape[-1]
            if size % cfg.group_size:
                raise QATError(
                    f"qat: {name}.{param_name} has input dimension {size}, not a multiple of qat.group_size "
                    f"{cfg.group_size}: pick a group size that divides it, or leave the module out of qat.modules"
                )
        if params:
            targets[name] = params
    if not targets:
        raise QATError(
            f"qat.modules {cfg.modules} match no module with weights in {type(model).__name__} "
            "(names as in model.named_modules(), e.g. 'model.layers.1.mlp.experts')"
        )
    return targets


def _quantized_forward(module: torch.nn.Module, params: list[str], group_size: int, forward: Any):
    def run(self, *args: Any, **kwargs: Any) -> Any:
        originals = {name: self._parameters.pop(name) for name in params}
        try:
            for name, weight in originals.items():
                setattr(self, name, fake_quant_ste(weight, group_size))
            return forward(*args, **kwargs)
        finally:
            for name, weight in originals.items():
                self.__dict__.pop(name, None)
                self._parameters[name] = weight

    return types.MethodType(run, module)


def install_qat(model: torch.nn.Module, cfg: QATConfig) -> dict[str, list[str]]:
    """Wrap the forward of every target module (idempotent); returns the targets. No-op when disabled."""
    if not cfg.enabled:
        return {}
    targets = qat_targets(model, cfg)
    modules = dict(model.named_modules())
    for name, params in targets.items():
        module = modules[name]
        if getattr(module, "_k2post_qat", False):
            continue
        module.forward = _quantized_forward(module, params, cfg.group_size, module.forward)
        module._k2post_qat = True
    return targets


@torch.no_grad()
def quantized_weights(model: torch.nn.Module, cfg: QATConfig) -> dict[str, torch.Tensor]:
    """{state-dict name: the INT4 round trip of that weight} for every target (empty when QAT is off)."""
    if not cfg.enabled:
        return {}
    modules = dict(model.named_modules())
    out = {}
    for name, params in qat_targets(model, cfg).items():
        for param_name in params:
            out[f"{name}.{param_name}"] = fake_quant_int4(getattr(modules[name], param_name).data, cfg.group_size)
    return out
