"""Per-head QK-Clip (Kimi K2): record each head's max pre-softmax logit, rescale W_q / W_k after a step.

Two halves, usable separately:

1. Recording. `MaxLogitRecorder.attach(model)` switches the model to a registered attention
   implementation (`k2post_sdpa_maxlogit`, or `k2post_eager_maxlogit` for an eager model) that,
   before calling the normal sdpa / eager attention unchanged, computes under `no_grad`, in
   query chunks of bounded memory, S_max^h = max over the valid (mask-allowed, non-padding
   query) positions of `scaling * q_i . k_j` per query head, exactly the logit that enters the
   softmax. Values are kept per `module.layer_idx` as a running max over calls (batch,
   micro-batches) until `reset()`; `paused()` skips forwards (eval, generation); `detach()`
   restores the previous implementation. Under data parallelism, `reduce_per_head_max`
   all-reduces (MAX) the maxima so every rank clips the same heads.
2. Clipping. `plan_qk_clip(model, per_head_max, tau)` turns the heads with S_max^h > tau into a
   list of `RowScale(param_name, rows, factor)` entries (gamma = tau / S_max^h):
   - GQA/MHA (q_proj/k_proj): an unshared key head (num kv heads == num heads) -> the head's
     q rows and k rows (weight and bias) by sqrt(gamma); a key head shared by several query
     heads -> only that query head's q rows (weight and bias) by gamma.
   - MLA (kv_b_proj): q-nope rows of q_b_proj (q_proj without q-LoRA) and the head's k-nope
     rows of kv_b_proj by sqrt(gamma), q-rope rows by gamma; the shared k-rope projection
     (kv_a_proj_with_mqa) and the V rows are never touched.
   `apply_row_scales(model, plan)` multiplies those rows in place. The split exists so the
   same plan can be applied to DeepSpeed ZeRO partitioned fp32 master weights.
   `apply_qk_clip` = plan + apply + `QKClipStats`; `QKClip` wires recorder and clip together.

Heads at or below tau are never touched (bit-identical). Non-finite S_max values are counted
in the stats and skipped (gamma would be 0 or NaN).
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

from k2post.optim.config import QKClipConfig

logger = logging.getLogger(__name__)

# Attention implementation of the plain model -> name of its recording twin.
RECORDING_IMPLS: dict[str, str] = {"sdpa": "k2post_sdpa_maxlogit", "eager": "k2post_eager_maxlogit"}
DEFAULT_CHUNK_BYTES = 64 * 2**20  # fp32 score chunk budget of the recorder (64 MiB)
_RECORDER_ATTR = "_k2post_maxlogit_recorder"
_DISABLE_HINT = "set `optim.qk_clip.enabled: false` to train without QK-Clip"


# --------------------------------------------------------------------------- recording math


def _rows_per_chunk(elems_per_row: int, chunk_bytes: int) -> int:
    """Query rows per chunk so that one fp32 score chunk stays under `chunk_bytes`."""
    return max(1, chunk_bytes // (4 * max(1, elems_per_row)))


def _bool_valid(mask: torch.Tensor) -> torch.Tensor:
    """A 4-D sdpa (bool, True = attend) or additive float mask as a bool 'attend' mask."""
    if mask.dtype == torch.bool:
        return mask
    return mask > torch.finfo(mask.dtype).min / 2


def _chunk_valid(
    mask: torch.Tensor | None, start: int, stop: int, lq: int, lk: int, causal: bool, device: torch.device
) -> torch.Tensor | None:
    """Bool [B|1, Hm, cq, Lk] of the logits to count for query rows [start, stop), or None (all).

    A query row whose own (diagonal) key is masked is a padding token and is dropped entirely.
    """
    if mask is None:
        if not causal:
            return None
        rows = torch.arange(start, stop, device=device)[:, None]
        return (rows >= torch.arange(lk, device=device)[None, :])[None, None]  # upper-left, like sdpa
    valid = _bool_valid(mask[..., start:stop, :])  # [B|1, Hm, cq, Lk]
    first = start + lk - lq  # key column of query `start` itself (keys may include a cache prefix)
    if first >= 0 and first + (stop - start) <= lk:
        rows = torch.arange(stop - start, device=device)
        own = valid[..., rows, rows + first]  # [B|1, Hm, cq]
        valid = valid & own[..., None]
    return valid


def _group_valid(valid: torch.Tensor, num_kv: int, group: int) -> torch.Tensor:
    """[B|1, Hm, cq, Lk] mask -> broadcastable to grouped scores [B, Hkv, G, cq, Lk]."""
    if valid.shape[1] == 1:
        return valid.unsqueeze(2)
    return valid.reshape(valid.shape[0], num_kv, group, *valid.shape[2:])


@torch.no_grad()
def per_head_max_logit(
    query: torch.Tensor,
    key: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None,
    causal: bool,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    token_valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per query head max of `scaling * q.k` over allowed positions (fp32), shape [H].

    query [B, H, Lq, D], key [B, Hkv, Lk, D] with H = Hkv * G (query head h uses key head
    h // G, as `repeat_kv` does); `attention_mask` a 4-D bool/additive mask [B|1, 1|H, Lq, Lk]
    or None (then `causal` says whether the upper-left causal mask applies). `token_valid`
    [B, L] (bool, L = Lq = Lk) marks the real tokens: padding is dropped as query and as key
    (a forward without an attention mask, or packed padding, would count it). A head with no
    allowed position gets -inf.
    """
    b, h, lq, d = query.shape
    num_kv, lk = key.shape[1], key.shape[2]
    group = h // num_kv
    scale = d**-0.5 if scaling is None else scaling
    key_t = key.float().transpose(-1, -2)  # [B, Hkv, D, Lk]
    best = torch.full((b, num_kv, group), -math.inf, device=query.device)
    step = _rows_per_chunk(b * h * lk, chunk_bytes)
    for start in range(0, lq, step):
        stop = min(lq, start + step)
        q = query[:, :, start:stop].float().reshape(b, num_kv, group * (stop - start), d)  # G query heads per key head
        scores = torch.matmul(q, key_t).view(b, num_kv, group, stop - start, lk)  # [B, Hkv, G, cq, Lk]
        valid = _chunk_valid(attention_mask, start, stop, lq, lk, causal, query.device)
        if token_valid is not None:
            tokens = token_valid[:, None, start:stop, None] & token_valid[:, None, None, :]  # [B, 1, cq, Lk]
            valid = tokens if valid is None else valid & tokens
        if valid is not None:
            scores.masked_fill_(~_group_valid(valid, num_kv, group), -math.inf)
        best = torch.maximum(best, scores.amax(dim=(-1, -2)))
    # scale > 0 and fp rounding is monotone, so scale * max(q.k) == max(scale * q.k) exactly.
    return best.reshape(b, h).amax(dim=0) * scale


# --------------------------------------------------------------------------- attention hook


def _inner_attention(inner: str, module: nn.Module) -> Callable[..., Any]:
    """The plain attention function the recording twin delegates to."""
    if inner == "sdpa":
        return sdpa_attention_forward
    eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if eager is None:
        raise RuntimeError(f"{type(module).__name__}: no eager_attention_forward in {type(module).__module__}")
    return eager


def _is_causal_unmasked(inner: str, module: nn.Module, query: torch.Tensor, is_causal: bool | None) -> bool:
    """Whether sdpa applies its own causal mask when it gets no mask (mirrors sdpa_attention_forward)."""
    if inner != "sdpa" or query.shape[2] <= 1:
        return False
    return bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))


def _make_recording_attention(inner: str) -> Callable[..., Any]:
    """Attention function: record the per-head max logit, then run `inner` attention unchanged."""

    def attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
        recorder = getattr(module, _RECORDER_ATTR, None)
        if recorder is not None and recorder.active and kwargs.get("cache") is None:  # paged caches: not recorded
            causal = attention_mask is None and _is_causal_unmasked(inner, module, query, kwargs.get("is_causal"))
            valid = recorder.token_valid_for(query, key)
            head_max = per_head_max_logit(query, key, attention_mask, scaling, causal, recorder.chunk_bytes, valid)
            recorder.record(module.layer_idx, head_max)
        return _inner_attention(inner, module)(module, query, key, value, attention_mask, scaling=scaling, **kwargs)

    attention.__name__ = f"{RECORDING_IMPLS[inner]}_forward"
    return attention


def register_recording_attention() -> None:
    """Register the recording attention twins (and their mask builders) with transformers."""
    masks = {"sdpa": sdpa_mask, "eager": eager_mask}
    for inner, name in RECORDING_IMPLS.items():
        AttentionInterface.register(name, _make_recording_attention(inner))
        AttentionMaskInterface.register(name, masks[inner])


register_recording_attention()


# --------------------------------------------------------------------------- layouts


class RowScale(NamedTuple):
    """Multiply rows `rows` (dim 0) of parameter `param_name` by `factor`."""

    param_name: str
    rows: slice
    factor: float


def _linear_scales(linear_name: str, linear: nn.Linear, rows: slice, factor: float) -> list[RowScale]:
    """Row scales of a Linear's weight rows and, if it has one, the same bias entries."""
    if rows.stop <= rows.start:
        return []
    out = [RowScale(f"{linear_name}.weight", rows, factor)]
    if linear.bias is not None:
        out.append(RowScale(f"{linear_name}.bias", rows, factor))
    return out


@dataclass(frozen=True)
class GQALayout:
    """q_proj/k_proj attention (MHA or GQA): query head h uses key head h // (H / Hkv)."""

    prefix: str  # qualified module name, e.g. "model.layers.0.self_attn"
    layer_idx: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    module: nn.Module = field(repr=False, compare=False)

    def head_row_scales(self, head: int, gamma: float) -> list[RowScale]:
        """Rows to scale so head `head`'s logits scale by exactly `gamma`."""
        rows = slice(head * self.head_dim, (head + 1) * self.head_dim)
        q_name, k_name = f"{self.prefix}.q_proj", f"{self.prefix}.k_proj"
        if self.num_kv_heads == self.num_heads:  # unshared key head: split gamma between q and k
            root = math.sqrt(gamma)
            return _linear_scales(q_name, self.module.q_proj, rows, root) + _linear_scales(
                k_name, self.module.k_proj, rows, root
            )
        return _linear_scales(q_name, self.module.q_proj, rows, gamma)  # shared key head: q only


@dataclass(frozen=True)
class MLALayout:
    """DeepSeek-V3 MLA: per head q = [q_nope; q_rope], k = [k_nope (kv_b_proj); k_rope (shared)]."""

    prefix: str
    layer_idx: int
    num_heads: int
    nope_dim: int
    rope_dim: int
    v_dim: int
    q_name: str  # "q_b_proj" (q-LoRA) or "q_proj"
    module: nn.Module = field(repr=False, compare=False)

    def head_row_scales(self, head: int, gamma: float) -> list[RowScale]:
        """q-nope and k-nope rows by sqrt(gamma), q-rope rows by gamma; k-rope and V untouched."""
        root = math.sqrt(gamma)
        q0 = head * (self.nope_dim + self.rope_dim)  # q rows of head: [q0, q0+nope) nope, then rope
        k0 = head * (self.nope_dim + self.v_dim)  # kv_b rows of head: [k0, k0+nope) k-nope, then V
        q_lin = getattr(self.module, self.q_name)
        q_name, kv_name = f"{self.prefix}.{self.q_name}", f"{self.prefix}.kv_b_proj"
        return (
            _linear_scales(q_name, q_lin, slice(q0, q0 + self.nope_dim), root)
            + _linear_scales(q_name, q_lin, slice(q0 + self.nope_dim, q0 + self.nope_dim + self.rope_dim), gamma)
            + _linear_scales(kv_name, self.module.kv_b_proj, slice(k0, k0 + self.nope_dim), root)
        )


AttentionLayout = GQALayout | MLALayout


def _check_rows(module: nn.Module, linear: nn.Linear, expected: int, what: str) -> None:
    """Fail loudly when a projection does not have the row count the layout assumes."""
    if linear.out_features != expected:
        raise ValueError(
            f"{type(module).__name__}.{what} has {linear.out_features} output rows, expected {expected}; "
            f"QK-Clip cannot map its rows to heads ({_DISABLE_HINT})"
        )


def _mla_layout(prefix: str, module: nn.Module) -> MLALayout:
    """Layout of a DeepseekV3-style MLA module."""
    q_name = "q_b_proj" if getattr(module, "q_b_proj", None) is not None else "q_proj"
    heads = int(module.num_heads)
    nope, rope, v = int(module.qk_nope_head_dim), int(module.qk_rope_head_dim), int(module.v_head_dim)
    _check_rows(module, getattr(module, q_name), heads * (nope + rope), q_name)
    _check_rows(module, module.kv_b_proj, heads * (nope + v), "kv_b_proj")
    return MLALayout(prefix, int(module.layer_idx), heads, nope, rope, v, q_name, module)


def _gqa_layout(prefix: str, module: nn.Module) -> GQALayout:
    """Layout of a q_proj/k_proj (Llama/Qwen2-style) attention module."""
    for norm in ("q_norm", "k_norm"):
        if getattr(module, norm, None) is not None:
            raise ValueError(
                f"{type(module).__name__} normalises q/k per head ({norm}): scaling W_q/W_k rows does not "
                f"scale its logits, so QK-Clip does not apply ({_DISABLE_HINT})"
            )
    head_dim = int(module.head_dim)
    heads, kv_heads = module.q_proj.out_features // head_dim, module.k_proj.out_features // head_dim
    _check_rows(module, module.q_proj, heads * head_dim, "q_proj")
    _check_rows(module, module.k_proj, kv_heads * head_dim, "k_proj")
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"{type(module).__name__}: {heads} query heads are not a multiple of {kv_heads} kv heads")
    return GQALayout(prefix, int(module.layer_idx), heads, kv_heads, head_dim, module)


def _layout_of(prefix: str, module: nn.Module) -> AttentionLayout | None:
    """The layout of `module` if it is a supported attention module, None if it is not attention."""
    if getattr(module, "kv_b_proj", None) is not None and hasattr(module, "qk_nope_head_dim"):
        return _mla_layout(prefix, module)
    projections = (getattr(module, "q_proj", None), getattr(module, "k_proj", None))
    if all(isinstance(proj, nn.Linear) for proj in projections):
        if hasattr(module, "layer_idx") and hasattr(module, "head_dim"):
            return _gqa_layout(prefix, module)
    if hasattr(module, "layer_idx") and "Attention" in type(module).__name__:
        raise ValueError(
            f"QK-Clip does not know the attention layout of {type(module).__name__} ({prefix}): it supports "
            f"q_proj/k_proj (MHA/GQA) and DeepSeek MLA (q_b_proj/kv_b_proj) modules; {_DISABLE_HINT}"
        )
    return None


def find_attention_layouts(model: nn.Module) -> list[AttentionLayout]:
    """Every attention module of `model` with its row layout, sorted by layer_idx."""
    layouts: list[AttentionLayout] = []
    for prefix, module in model.named_modules():
        layout = _layout_of(prefix, module)
        if layout is not None:
            layouts.append(layout)
    if not layouts:
        raise ValueError(f"QK-Clip found no attention module in {type(model).__name__}; {_DISABLE_HINT}")
    indices = [layout.layer_idx for layout in layouts]
    if len(set(indices)) != len(indices):
        raise ValueError(f"{type(model).__name__}: attention layer_idx values are not unique: {indices}")
    return sorted(layouts, key=lambda layout: layout.layer_idx)


# --------------------------------------------------------------------------- recorder


class MaxLogitRecorder:
    """Records per-layer, per-query-head max pre-softmax attention logits during forwards.

    with MaxLogitRecorder().attach(model) as rec:
        model(**batch)
        rec.per_head()  # {layer_idx: Tensor[H]}
    """

    def __init__(self, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        self.chunk_bytes = chunk_bytes
        self.active = True  # False inside `paused()`
        self.token_valid: torch.Tensor | None = None  # [B, L] bool inside `real_tokens()`
        self._max: dict[int, torch.Tensor] = {}
        self._model: PreTrainedModel | None = None
        self._previous_impl: str | None = None
        self._modules: list[nn.Module] = []

    @property
    def attached(self) -> bool:
        """True between `attach` and `detach`."""
        return self._model is not None

    def attach(self, model: PreTrainedModel) -> "MaxLogitRecorder":
        """Switch `model` to the recording attention implementation and start recording."""
        if self.attached:
            raise RuntimeError("this MaxLogitRecorder is already attached; detach() it first")
        layouts = find_attention_layouts(model)
        previous = model.config._attn_implementation
        if previous not in RECORDING_IMPLS:
            raise ValueError(
                f"max-logit recording supports attention implementations {sorted(RECORDING_IMPLS)}, the model uses "
                f"{previous!r} (also the case when another recorder is attached); load it with "
                f"attn_implementation='sdpa' or {_DISABLE_HINT}"
            )
        model.set_attn_implementation(RECORDING_IMPLS[previous])
        if model.config._attn_implementation != RECORDING_IMPLS[previous]:
            raise RuntimeError(f"{type(model).__name__} refused attention implementation {RECORDING_IMPLS[previous]!r}")
        self._model, self._previous_impl = model, previous
        self._modules = [layout.module for layout in layouts]
        for module in self._modules:
            setattr(module, _RECORDER_ATTR, self)
        return self

    def detach(self) -> None:
        """Stop recording and restore the model's previous attention implementation (no-op if detached)."""
        if self._model is None:
            return
        for module in self._modules:
            if getattr(module, _RECORDER_ATTR, None) is self:
                delattr(module, _RECORDER_ATTR)
        self._model.set_attn_implementation(self._previous_impl)
        self._model, self._previous_impl, self._modules = None, None, []

    def reset(self) -> None:
        """Forget the recorded maxima (call after each optimizer step)."""
        self._max.clear()

    def record(self, layer_idx: int, head_max: torch.Tensor) -> None:
        """Fold one call's per-head maxima [H] into the running max of layer `layer_idx`."""
        previous = self._max.get(layer_idx)
        self._max[layer_idx] = head_max if previous is None else torch.maximum(previous, head_max)

    @contextlib.contextmanager
    def real_tokens(self, valid: torch.Tensor | None) -> Iterator[None]:
        """Forwards inside this block count only the tokens where `valid` [B, L] is true (not padding)."""
        previous, self.token_valid = self.token_valid, None if valid is None else valid.bool()
        try:
            yield
        finally:
            self.token_valid = previous

    def token_valid_for(self, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor | None:
        """The `real_tokens` mask on the query's device, checked against the forward's shapes."""
        if self.token_valid is None:
            return None
        b, lq, lk = query.shape[0], query.shape[2], key.shape[2]
        if tuple(self.token_valid.shape) != (b, lq) or lq != lk:
            raise ValueError(
                f"MaxLogitRecorder.real_tokens mask has shape {tuple(self.token_valid.shape)} but the forward has "
                f"batch {b}, {lq} queries and {lk} keys: pass the [batch, seq_len] mask of the same input_ids"
            )
        return self.token_valid.to(query.device)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Forwards inside this block (eval, generation) are not recorded."""
        previous, self.active = self.active, False
        try:
            yield
        finally:
            self.active = previous

    def per_head(self) -> dict[int, torch.Tensor]:
        """{layer_idx: per-query-head max logit [H] (fp32)} since the last reset."""
        return {idx: value.detach().clone() for idx, value in sorted(self._max.items())}

    def __enter__(self) -> "MaxLogitRecorder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()


def recording_real_tokens(
    recorder: MaxLogitRecorder | None, valid: torch.Tensor | None
) -> contextlib.AbstractContextManager:
    """`recorder.real_tokens(valid)`, or a no-op context when QK-Clip is off (recorder None)."""
    return contextlib.nullcontext() if recorder is None else recorder.real_tokens(valid)


def reduce_per_head_max(per_head_max: dict[int, torch.Tensor], group: Any = None) -> dict[int, torch.Tensor]:
    """All-reduce (MAX) the per-head maxima over data-parallel ranks; identity without torch.distributed.

    Every rank must hold the same layer indices and head counts; all ranks then clip identically.
    """
    dist = torch.distributed
    if not per_head_max or not dist.is_available() or not dist.is_initialized() or dist.get_world_size(group) == 1:
        return per_head_max
    keys = sorted(per_head_max)
    flat = torch.cat([per_head_max[k].float().reshape(-1) for k in keys])  # [sum_l H_l]
    dist.all_reduce(flat, op=dist.ReduceOp.MAX, group=group)
    sizes = [per_head_max[k].numel() for k in keys]
    return dict(zip(keys, flat.split(sizes)))


# --------------------------------------------------------------------------- clipping


@dataclass
class QKClipStats:
    """What one QK-Clip pass saw and did."""

    tau: float
    max_logit_per_layer: dict[int, float] = field(default_factory=dict)
    num_heads: int = 0
    num_clipped: int = 0
    clipped_heads: list[tuple[int, int]] = field(default_factory=list)  # (layer_idx, head)
    num_nonfinite: int = 0  # heads with a NaN/inf max logit (skipped)

    @property
    def frac_clipped(self) -> float:
        """Fraction of recorded heads that were clipped (0 when nothing was recorded)."""
        return self.num_clipped / self.num_heads if self.num_heads else 0.0

    @property
    def max_logit(self) -> float:
        """Max logit over all layers (-inf when nothing was recorded)."""
        return max(self.max_logit_per_layer.values(), default=-math.inf)

    def to_metrics(self) -> dict[str, float]:
        """Flat metrics: qk_clip/max_logit[/layer_i], qk_clip/frac_clipped, qk_clip/num_clipped."""
        metrics = {f"qk_clip/max_logit/layer_{idx}": value for idx, value in sorted(self.max_logit_per_layer.items())}
        if self.max_logit_per_layer:
            metrics["qk_clip/max_logit"] = self.max_logit
        metrics["qk_clip/frac_clipped"] = self.frac_clipped
        metrics["qk_clip/num_clipped"] = float(self.num_clipped)
        if self.num_nonfinite:
            metrics["qk_clip/num_nonfinite"] = float(self.num_nonfinite)
        return metrics


def _head_values(per_head_max: dict[int, torch.Tensor]) -> dict[int, list[float]]:
    """Per-head maxima as Python floats (one device->host copy per layer)."""
    return {idx: per_head_max[idx].detach().float().cpu().tolist() for idx in sorted(per_head_max)}


def _clip_factor(s_max: float, tau: float) -> float | None:
    """gamma = tau / s_max for a finite s_max above tau, else None (head untouched)."""
    if not math.isfinite(s_max) or s_max <= tau:
        return None
    return tau / s_max


def compute_qk_clip_stats(per_head_max: dict[int, torch.Tensor], tau: float) -> QKClipStats:
    """Stats of a clip pass with threshold `tau` over `per_head_max`, without touching any weights."""
    stats = QKClipStats(tau=float(tau))
    for idx, values in _head_values(per_head_max).items():
        stats.max_logit_per_layer[idx] = max((v for v in values if not math.isnan(v)), default=-math.inf)
        stats.num_heads += len(values)
        stats.num_nonfinite += sum(1 for v in values if math.isnan(v) or v == math.inf)
        clipped = [(idx, head) for head, v in enumerate(values) if _clip_factor(v, tau) is not None]
        stats.clipped_heads.extend(clipped)
        stats.num_clipped += len(clipped)
    return stats


def plan_qk_clip(model: nn.Module, per_head_max: dict[int, torch.Tensor], tau: float) -> list[RowScale]:
    """The row scales that bring every head with S_max^h > tau down to exactly tau.

    Layers missing from `per_head_max` are left alone; a recorded layer the model does not
    have, or a head count that does not match, is an error.
    """
    layouts = {layout.layer_idx: layout for layout in find_attention_layouts(model)}
    plan: list[RowScale] = []
    for idx, values in _head_values(per_head_max).items():
        layout = layouts.get(idx)
        if layout is None or len(values) != layout.num_heads:
            raise ValueError(
                f"recorded layer {idx} with {len(values)} heads does not match the model's attention layers "
                f"{ {i: lay.num_heads for i, lay in layouts.items()} }"
            )
        for head, s_max in enumerate(values):
            gamma = _clip_factor(s_max, tau)
            if gamma is not None:
                plan.extend(layout.head_row_scales(head, gamma))
    return plan


@torch.no_grad()
def apply_row_scales(model: nn.Module, plan: list[RowScale]) -> None:
    """Multiply the planned rows of `model`'s parameters in place (other entries untouched)."""
    params = dict(model.named_parameters())
    for entry in plan:
        param = params.get(entry.param_name)
        if param is None:
            raise KeyError(
                f"QK-Clip plan names {entry.param_name!r}, which is not a parameter of {type(model).__name__}"
            )
        param.data[entry.rows].mul_(entry.factor)


def apply_qk_clip(model: nn.Module, per_head_max: dict[int, torch.Tensor], tau: float) -> QKClipStats:
    """Clip every head whose recorded max logit exceeds `tau`; return what was seen and done."""
    plan = plan_qk_clip(model, per_head_max, tau)
    apply_row_scales(model, plan)
    stats = compute_qk_clip_stats(per_head_max, tau)
    if stats.num_nonfinite:
        logger.warning("QK-Clip: %d heads have a non-finite max logit; they were not clipped", stats.num_nonfinite)
    return stats


class QKClip:
    """Recorder + clip for a training loop: build once, call `after_step()` after each optimizer step.

    With `cfg.enabled = False` nothing is attached (the model keeps plain attention) and
    `after_step()` returns empty stats.
    """

    def __init__(self, model: PreTrainedModel, cfg: QKClipConfig, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        self.model, self.cfg = model, cfg
        self.recorder: MaxLogitRecorder | None = None
        if cfg.enabled:
            self.recorder = MaxLogitRecorder(chunk_bytes).attach(model)

    def after_step(self) -> QKClipStats:
        """Clip heads over tau using the maxima recorded since the last call, then reset the recorder."""
        if self.recorder is None:
            return QKClipStats(tau=self.cfg.logit_threshold)
        per_head = reduce_per_head_max(self.recorder.per_head())
        stats = apply_qk_clip(self.model, per_head, self.cfg.logit_threshold)
        self.recorder.reset()
        return stats

    def close(self) -> None:
        """Detach the recorder (restores the previous attention implementation)."""
        if self.recorder is not None:
            self.recorder.detach()

    def __enter__(self) -> "QKClip":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
