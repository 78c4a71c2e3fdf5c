"""INT4 quantization-aware training: the trainer's forward sees the INT4 round trip of the chosen weights.

`install_qat(model, cfg)` wraps the forward of every module whose name matches `cfg.modules` (fnmatch; default:
the routed MoE experts, `*.mlp.experts`): during that forward each of the module's floating-point weights of
2+ dims is its INT4 round trip (`_FakeQuantSTE`: INT4 values in the forward, the gradient straight through to
the full-precision weight the optimizer (MuonClip) keeps). Parameters stay where and what they are (names,
ZeRO partitions, optimizer state), so QAT composes with DeepSpeed ZeRO 0-3 and Muon: inside the forward, after
DeepSpeed's pre-forward hooks have gathered them, the wrapper swaps each target for its fake-quant tensor and
puts the Parameter back when the forward returns.

The fake-quant tensor is not kept from the forward to the backward (ZeRO-3 frees gathered parameters after the
forward, but a fresh tensor the graph saved would stay: every routed expert's weights, 4x the activations on
tiny-k2): when the forward returns its storage is released (`_QuantSlot`, FSDP's storage resize), when the
module's backward starts (a hook on its outputs' gradient) it is recomputed from the parameter, and once its
gradient is through (`_FakeQuantSTE.backward`) it is released again. Values and gradients are bit-identical to
holding it.

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
from k2post.quant.int4 import fake_quant_int4

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


class _QuantSlot:
    """One fake-quant weight of one forward: its storage is released when the forward returns and recomputed from
    the full-precision weight when the module's backward starts, so nothing but the parameter is kept in between
    (the FSDP move: views the autograd graph saved share this storage, so they see it refilled)."""

    def __init__(self, weight: torch.nn.Parameter, group_size: int) -> None:
        self.weight, self.group_size = weight, group_size
        self.alias: torch.Tensor | None = None  # w_hat's storage without its autograd history (no cycle to ctx)
        self.nbytes = 0

    def hold(self, w_hat: torch.Tensor) -> torch.Tensor:
        self.alias, self.nbytes = w_hat.data, w_hat.untyped_storage().nbytes()
        return w_hat

    def release(self) -> None:
        if self.alias is not None:
            self.alias.untyped_storage().resize_(0)

    def restore(self) -> None:
        if self.alias is None or self.alias.untyped_storage().nbytes() == self.nbytes:
            return
        self.alias.untyped_storage().resize_(self.nbytes)
        with torch.no_grad():
            self.alias.copy_(fake_quant_int4(self.weight.detach(), self.group_size))


class _FakeQuantSTE(torch.autograd.Function):
    """`fake_quant_int4(weight)` in the forward, the gradient straight through to `weight` in the backward; the
    backward runs after every use of w_hat has had its gradient, so it releases w_hat's storage again."""

    @staticmethod
    def forward(ctx: Any, weight: torch.Tensor, group_size: int, slot: _QuantSlot) -> torch.Tensor:
        ctx.slot = slot
        return fake_quant_int4(weight, group_size)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        ctx.slot.release()
        return grad, None, None


def _restore_before_backward(output: Any, slots: list[_QuantSlot]) -> None:
    """Hook every output tensor that carries a gradient: when its gradient arrives (the module's backward is next;
    under ZeRO-3 after DeepSpeed has gathered the parameters again) the released weights are recomputed."""

    def restore(_grad: torch.Tensor) -> None:
        for slot in slots:
            slot.restore()

    tensors = output if isinstance(output, (tuple, list)) else [output]
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
            tensor.register_hook(restore)


def _quantized_forward(module: torch.nn.Module, params: list[str], group_size: int, forward: Any):
    def run(self, *args: Any, **kwargs: Any) -> Any:
        originals = {name: self._parameters.pop(name) for name in params}
        slots = [_QuantSlot(weight, group_size) for weight in originals.values()]
        try:
            for (name, weight), slot in zip(originals.items(), slots):
                setattr(self, name, slot.hold(_FakeQuantSTE.apply(weight, group_size, slot)))
            output = forward(*args, **kwargs)
        finally:
            for name, weight in originals.items():
                self.__dict__.pop(name, None)
                self._parameters[name] = weight
        if torch.is_grad_enabled():
            _restore_before_backward(output, slots)
            for slot in slots:
                slot.release()
        return output

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
