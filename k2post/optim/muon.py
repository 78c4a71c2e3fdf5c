"""MuonClip's update rules: Muon for hidden matrices and AdamW for the rest, in one optimizer.

Muon, per matrix W [n, m] (a 3-D fused expert weight [E, n, m] is E matrices) with gradient g:

    buf <- mu * buf + (1 - mu) * g                 (torch.optim.Muon's EMA form, `lerp`)
    D    = (1 - mu) * g + mu * buf   if nesterov   else buf
    O    = NS5(D) * rms_scale * sqrt(max(n, m))     (RMS(O) ~ rms_scale = 0.2, matching AdamW)
    W   <- W * (1 - lr * wd) - lr * O               (decoupled WD with the unadjusted lr)

Momentum convention: K2/Moonlight write buf <- mu*buf + g, D = g + mu*buf. torch.optim.Muon
(which our tests compare against) keeps buf' = (1 - mu) * buf instead, so D' = (1 - mu) * D.
Newton-Schulz normalizes by ||D||_F first, so both give the same O (up to eps = 1e-7 and bf16
rounding of the input); we use torch's form so results match it to float precision, and the
momentum state is interchangeable with torch.optim.Muon's ("momentum_buffer").

AdamW (embeddings, lm_head, norms, biases): torch.optim.AdamW's formula, bias-corrected,
decoupled weight decay with the same lr and wd. State keys match torch's ("step",
"exp_avg", "exp_avg_sq"), with "step" a Python int.

Reusable per-tensor pieces (for a distributed caller that gathers full matrices, e.g. under
DeepSpeed ZeRO, Moonlight-style: momentum on the local shard, gather, NS, keep the local part):
- `muon_direction(grad, buf, momentum, nesterov)`: elementwise, so it runs on a shard;
- `muon_update(direction, ns_steps, eps, rms_scale)`: the scaled O of a FULL matrix;
- `orthogonalize_many(directions, ns_steps, eps)`: NS of several same-shaped full matrices in
  one batched call (bf16 results, scale them with `rms_factor(shape, rms_scale)`);
- `apply_update_(param, update, lr, weight_decay)`: W <- W*(1 - lr*wd) - lr*update, elementwise;
- `muon_step_(param, grad, state, group)` / `adamw_step_(param, grad, state, group)`: a whole
  step on one full tensor, `group` being a param-group dict (or `group_hparams(cfg)`).

QK-Clip is not applied here: run it after `step()` (k2post/optim/qk_clip.py), e.g. through
`optimizer.register_step_post_hook`.

Tests: `python -m pytest tests/k2post/optim/test_muon.py -q`; speed: `python benchmarks/muon_step.py`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from k2post.optim.config import OptimConfig
from k2post.optim.newton_schulz import newton_schulz_wide, ns_compute_dtype, orthogonalize
from k2post.optim.param_groups import ParamSpecError, build_param_groups, row_splits

# Same-shaped Muon directions are orthogonalized together in batches of at most this many
# elements (bf16: 2 bytes each), which bounds the extra memory of batching.
MAX_BATCH_NUMEL = 1 << 26


def group_hparams(cfg: OptimConfig) -> dict[str, Any]:
    """Hyper-parameters of a param group, from `cfg` (the defaults of every MuonClip group)."""
    return {
        "lr": cfg.lr,
        "weight_decay": cfg.weight_decay,
        "momentum": cfg.momentum,
        "nesterov": cfg.nesterov,
        "ns_steps": cfg.ns_steps,
        "ns_eps": cfg.ns_eps,
        "ns_dtype": cfg.ns_dtype,
        "rms_scale": cfg.rms_scale,
        "betas": tuple(cfg.adamw_betas),
        "eps": cfg.adamw_eps,
    }


@dataclass
class UpdateStats:
    """Size of the Muon updates O applied since `reset` (O before the lr: RMS(O) ~ rms_scale by design)."""

    sq_sum: float = 0.0
    numel: int = 0

    def add(self, update: Tensor, scale: float = 1.0) -> None:
        """Count `scale * update` (any shape; a shard is fine)."""
        self.sq_sum += float(update.float().pow(2).sum()) * scale * scale
        self.numel += update.numel()

    def reset(self) -> None:
        self.sq_sum, self.numel = 0.0, 0


def rms_factor(shape: torch.Size | tuple[int, ...], rms_scale: float) -> float:
    """rms_scale * sqrt(max(n, m)) for a matrix (or batch of matrices) of shape [..., n, m]."""
    return rms_scale * math.sqrt(max(shape[-2], shape[-1]))


def matrix_view(tensor: Tensor, splits: int) -> Tensor:
    """`tensor` [..., k*n, m] as the k-times-more matrices it stacks: [B*k, n, m] (a view; k = `splits`).

    With splits 1 the tensor itself. The view keeps the memory order, so `.reshape(tensor.shape)` of
    anything computed on it maps each matrix back to its rows."""
    if splits == 1:
        return tensor
    n, m = tensor.shape[-2] // splits, tensor.shape[-1]
    return tensor.reshape(-1, n, m)  # [..., k*n, m] -> [B*k, n, m]: rows [j*n, (j+1)*n) are matrix j


def muon_direction(grad: Tensor, momentum_buf: Tensor, momentum: float, nesterov: bool) -> Tensor:
    """Update the momentum buffer in place and return the direction to orthogonalize.

    buf <- buf.lerp(g, 1 - mu) = mu*buf + (1-mu)*g; returns g.lerp(buf, mu) = (1-mu)*g + mu*buf
    if nesterov, else buf itself (do not modify it). Elementwise: works on a shard of a matrix.
    """
    momentum_buf.lerp_(grad, 1 - momentum)
    return grad.lerp(momentum_buf, momentum) if nesterov else momentum_buf


def muon_update(direction: Tensor, ns_steps: int = 5, eps: float = 1e-7, rms_scale: float = 0.2) -> Tensor:
    """O = NS(direction) * rms_scale * sqrt(max(n, m)) for a full matrix [n, m] or batch [E, n, m]."""
    ortho = orthogonalize(direction, steps=ns_steps, eps=eps)  # [..., n, m], direction's dtype
    return ortho.mul_(rms_factor(direction.shape, rms_scale))


def apply_update_(param: Tensor, update: Tensor, lr: float, weight_decay: float, scale: float = 1.0) -> None:
    """W <- W * (1 - lr * wd) - lr * scale * update, in place (decoupled WD, unadjusted lr)."""
    if weight_decay != 0:
        param.mul_(1 - lr * weight_decay)
    param.add_(update, alpha=-lr * scale)


def _momentum_buffer(state: dict, param: Tensor) -> Tensor:
    """The Muon momentum buffer in `state`, created as zeros on first use."""
    if "momentum_buffer" not in state:
        state["momentum_buffer"] = torch.zeros_like(param, memory_format=torch.preserve_format)
    return state["momentum_buffer"]


@torch.no_grad()
def muon_step_(
    param: Tensor,
    grad: Tensor,
    state: dict,
    group: Mapping[str, Any],
    splits: int = 1,
    stats: UpdateStats | None = None,
) -> None:
    """One Muon step on one full tensor ([n, m] or [E, n, m]); `state` holds "momentum_buffer".

    `group` needs lr, weight_decay, momentum, nesterov, ns_steps, ns_eps, rms_scale
    (a MuonClip param group or `group_hparams(cfg)`); `splits` is `row_splits` of the param (a fused
    gate_up_proj: 2); `stats` collects the applied update's size. Same numerics as `MuonClip.step`.
    """
    buf = _momentum_buffer(state, param)
    direction = matrix_view(muon_direction(grad, buf, group["momentum"], group["nesterov"]), splits)
    dtype = ns_compute_dtype(group.get("ns_dtype", "auto"), param.device)
    ortho = orthogonalize(direction.to(dtype), steps=group["ns_steps"], eps=group["ns_eps"], dtype=dtype)
    scale = rms_factor(direction.shape, group["rms_scale"])
    apply_update_(param, ortho.reshape(param.shape), float(group["lr"]), group["weight_decay"], scale)
    if stats is not None:
        stats.add(ortho, scale)


def _adamw_state(state: dict, param: Tensor) -> tuple[Tensor, Tensor]:
    """exp_avg and exp_avg_sq in `state` (zeros and step 0 on first use)."""
    if "exp_avg" not in state:
        state["step"] = 0
        state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
    return state["exp_avg"], state["exp_avg_sq"]


@torch.no_grad()
def adamw_step_(param: Tensor, grad: Tensor, state: dict, group: Mapping[str, Any]) -> None:
    """One AdamW step on one tensor (any shape; elementwise, so a shard works too).

    `group` needs lr, weight_decay, betas, eps. Same formula and state as torch.optim.AdamW.
    """
    exp_avg, exp_avg_sq = _adamw_state(state, param)
    lr, (beta1, beta2) = float(group["lr"]), group["betas"]
    state["step"] += 1
    if group["weight_decay"] != 0:
        param.mul_(1 - lr * group["weight_decay"])
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    step_size = lr / (1 - beta1 ** state["step"])
    bias_correction2_sqrt = (1 - beta2 ** state["step"]) ** 0.5
    denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(group["eps"])
    param.addcdiv_(exp_avg, denom, value=-step_size)


def _batches(params: list[tuple[Tensor, int]], max_numel: int = MAX_BATCH_NUMEL) -> Iterable[list[tuple[Tensor, int]]]:
    """(param, row splits) pairs split into batches of the same matrix shape [n, m] (after splitting
    fused rows), dtype and device, each of at most `max_numel` elements (a larger param is a batch
    of its own)."""
    buckets: dict[tuple, list[tuple[Tensor, int]]] = defaultdict(list)
    for param, splits in params:
        matrix = (param.shape[-2] // splits, param.shape[-1])
        buckets[(matrix, param.dtype, param.device)].append((param, splits))
    for bucket in buckets.values():
        batch: list[tuple[Tensor, int]] = []
        numel = 0
        for param, splits in bucket:
            if batch and numel + param.numel() > max_numel:
                yield batch
                batch, numel = [], 0
            batch.append((param, splits))
            numel += param.numel()
        yield batch


# On CPU, one batched bmm over large matrices is slower than a GEMM per matrix (measured with
# benchmarks/muon_step.py: 1.42 s vs 1.32 s for 24 matrices of 1024x4096-class); for small
# matrices batching wins (0.019 s vs 0.033 s on tiny-model shapes). On GPU batching always helps.
CPU_BATCH_MAX_MATRIX_NUMEL = 1 << 20


def _prefer_unbatched(example: Tensor, matrix_numel: int) -> bool:
    return example.device.type == "cpu" and matrix_numel > CPU_BATCH_MAX_MATRIX_NUMEL


def orthogonalize_many(
    directions: list[Tensor], steps: int = 5, eps: float = 1e-7, dtype: torch.dtype = torch.bfloat16
) -> list[Tensor]:
    """NS of directions that share their last two dims ([n, m] or [E, n, m]) in one batched
    call in `dtype`; returns `dtype` tensors of the directions' shapes (unscaled: multiply by `rms_factor`).

    The directions are copied (cast to `dtype`, tall ones transposed) into one contiguous wide
    stack [B, min, max] in a single pass, orthogonalized together, and returned as views.
    """
    n, m = directions[0].shape[-2:]
    if len(directions) == 1 or _prefer_unbatched(directions[0], n * m):
        return [orthogonalize(d.to(dtype), steps=steps, eps=eps, dtype=dtype) for d in directions]
    if any(d.shape[-2:] != (n, m) or d.ndim not in (2, 3) for d in directions):
        shapes = [tuple(d.shape) for d in directions]
        raise ValueError(f"orthogonalize_many takes [n, m] / [E, n, m] tensors sharing one [n, m], got {shapes}")
    tall = n > m
    sizes = [d.numel() // (n * m) for d in directions]
    wide = (m, n) if tall else (n, m)
    stacked = torch.empty((sum(sizes), *wide), dtype=dtype, device=directions[0].device)  # [B, min, max]
    for chunk, direction in zip(stacked.split(sizes), directions):
        src = direction.reshape(-1, n, m)  # [E, n, m]
        chunk.copy_(src.mT if tall else src)
    ortho = newton_schulz_wide(stacked, steps, eps)  # [B, min, max], dtype
    chunks = [chunk.mT if tall else chunk for chunk in ortho.split(sizes)]  # [E, n, m] views
    return [chunk.reshape(d.shape) for chunk, d in zip(chunks, directions)]  # views, no copies


def run_closure(closure: Callable[[], Tensor] | None) -> Tensor | None:
    """The loss of an optimizer's `step(closure)` argument, computed with grad enabled (None if no closure)."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class MuonClip(torch.optim.Optimizer):
    """One optimizer, two kinds of param groups: `use_muon=True` (Muon) and `False` (AdamW).

    `MuonClip(param_groups, cfg)`: every group is a dict with "params" and "use_muon" (and
    optionally "names", and overrides of any key of `group_hparams`, e.g. lr or weight_decay);
    the rest comes from `cfg`. Params whose .grad is None are skipped (their state is kept).
    Muon directions of the same shape are orthogonalized in one batched call.
    """

    def __init__(self, params: Iterable[dict], cfg: OptimConfig) -> None:
        self.cfg = cfg
        super().__init__(params, group_hparams(cfg))

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group after checking it says which update it uses and Muon params are matrices."""
        if "use_muon" not in param_group:
            raise ValueError("every MuonClip param group needs 'use_muon': True (Muon) or False (AdamW)")
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        if group["use_muon"]:
            names = group.get("names") or [f"#{i}" for i in range(len(group["params"]))]
            for name, param in zip(names, group["params"]):
                if param.ndim not in (2, 3):
                    raise ParamSpecError(
                        f"param {name} has shape {tuple(param.shape)}: a Muon group takes 2-D matrices and 3-D "
                        "stacks of them only; put it in a group with use_muon=False"
                    )

    def _muon_group_step(self, group: dict[str, Any]) -> None:
        """Muon update of every param with a grad in a `use_muon` group, batched by shape.

        Directions are built batch by batch, so the extra memory is one batch (fp32 + bf16).
        """
        lr, wd = float(group["lr"]), group["weight_decay"]
        names = group.get("names") or [""] * len(group["params"])
        params = [
            (p, row_splits(name, tuple(p.shape), self.cfg))
            for name, p in zip(names, group["params"])
            if p.grad is not None
        ]
        for batch in _batches(params, self.cfg.ns_batch_numel):
            dtype = ns_compute_dtype(group.get("ns_dtype", "auto"), batch[0][0].device)
            directions = [
                matrix_view(
                    muon_direction(p.grad, _momentum_buffer(self.state[p], p), group["momentum"], group["nesterov"]), k
                )
                for p, k in batch
            ]
            orthos = orthogonalize_many(directions, group["ns_steps"], group["ns_eps"], dtype)
            for (param, _), ortho, direction in zip(batch, orthos, directions):
                scale = rms_factor(direction.shape, group["rms_scale"])
                apply_update_(param, ortho.reshape(param.shape), lr, wd, scale)
            del directions

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        """One optimizer step over all groups; returns the closure's loss if one is given."""
        loss = run_closure(closure)
        for group in self.param_groups:
            if group["use_muon"]:
                self._muon_group_step(group)
                continue
            for param in group["params"]:
                if param.grad is not None:
                    adamw_step_(param, param.grad, self.state[param], group)
        return loss


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> MuonClip:
    """MuonClip over `model`'s trainable params, routed by `build_param_groups`."""
    return MuonClip(build_param_groups(model, cfg), cfg)
