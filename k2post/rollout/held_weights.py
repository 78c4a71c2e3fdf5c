"""What a verified push checks: the engine's own parameters after loading, not the tensors it received.

A push hands HF-named tensors to vLLM's `load_weights`, which copies them into the engine's parameters: q/k/v
stacked into `qkv_proj`, gate/up into `gate_up_proj`, the MLA down-projections into `fused_qkv_a_proj`, every
expert's gate/up/down into the fused `w13_weight`/`w2_weight`, each rounded to the parameter's dtype. Comparing the
received tensors with the trainer's proves the transport; it says nothing about where the loader put them. Here
k2post maps each served tensor to the rows of the engine parameter that must hold it (`engine_slots`, its own
table, not vLLM's loader), hashes those rows of the live parameter (the CPU patch's unpacked experts, the
load-time dtype of a widened bias) and compares with the served tensor cast to that parameter's dtype:

- `equal`: the engine holds the served tensor bit for bit (its dtype, or a cast that loses nothing);
- `rounded`: it holds the served tensor cast to its dtype, and that cast changed values (a bf16 engine holding an
  fp32 trainer's weights, or the INT4 round trip with fp32 scales): what a checkpoint load would hold too;
- `wrong`: anything else (a permuted or transposed mapping, a stale or skipped tensor, no engine parameter).

    expected = expected_held(batch, engine_dtypes(params))     # while receiving (the buffers are reused)
    verdicts = held_verdicts(params, expected)                  # after the update: name -> equal/rounded/wrong
    check_held(verdicts)                                        # PushVerificationError naming the first wrong one
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from k2post.rollout.weight_update import PushVerificationError, tensor_digests

FUSED_MODULES = {  # vLLM's fused module -> the HF modules it stacks, in their order along dim 0
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
    "fused_qkv_a_proj": ("q_a_proj", "kv_a_proj_with_mqa"),
}
EXPERT_WEIGHTS = {"gate_proj": ("w13_weight", 0), "up_proj": ("w13_weight", 1), "down_proj": ("w2_weight", 0)}
_EXPERT = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<expert>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")
VERDICTS = ("equal", "rounded", "wrong")


@dataclass(frozen=True)
class Slot:
    """Where the engine holds one served tensor: rows [start, stop) of `param` (of its expert `expert`)."""

    param: str
    expert: int | None
    start: int
    stop: int


def _rows(shape: tuple[int, ...]) -> int:
    return shape[0] if shape else 1


def fused_slot(name: str, hf_shapes: dict[str, tuple[int, ...]], engine: set[str]) -> Slot | None:
    """The rows of a fused engine parameter (`FUSED_MODULES`) that hold `name`; None when none does."""
    module, _, leaf = name.rpartition(".")
    parent, _, proj = module.rpartition(".")
    for fused, pieces in FUSED_MODULES.items():
        target = f"{parent}.{fused}.{leaf}"
        if proj not in pieces or target not in engine:
            continue
        before = [hf_shapes.get(f"{parent}.{piece}.{leaf}") for piece in pieces[: pieces.index(proj)]]
        if any(shape is None for shape in before):  # a sibling was not pushed: its rows are unknown
            return None
        start = sum(_rows(shape) for shape in before)
        return Slot(target, None, start, start + _rows(hf_shapes[name]))
    return None


def expert_params(engine: Iterable[str]) -> dict[tuple[str, str], str]:
    """(HF experts prefix, fused weight) -> engine name: `model.layers.1.mlp.experts.routed_experts.w13_weight` is
    ("model.layers.1.mlp.experts", "w13_weight")."""
    out = {}
    for name in engine:
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("w13_weight", "w2_weight") and ".experts." in name:
            out[(name.split(".experts.")[0] + ".experts", leaf)] = name
    return out


def expert_slot(name: str, hf_shapes: dict[str, tuple[int, ...]], experts: dict[tuple[str, str], str]) -> Slot | None:
    """The rows of a fused expert parameter [E, rows, cols] that hold the per-expert HF tensor `name`."""
    match = _EXPERT.match(name)
    if match is None:
        return None
    weight, part = EXPERT_WEIGHTS[match["proj"]]
    param = experts.get((match["prefix"], weight))
    if param is None:
        return None
    rows = _rows(hf_shapes[name])
    return Slot(param, int(match["expert"]), rows * part, rows * (part + 1))


def engine_slots(hf_shapes: dict[str, tuple[int, ...]], engine: set[str]) -> dict[str, Slot | None]:
    """Served name -> where the engine holds it (None: no engine parameter does). A name the engine has is held
    whole (its leading rows: vLLM pads vocabularies); otherwise a fused module or a fused expert weight holds it."""
    experts = expert_params(engine)
    out: dict[str, Slot | None] = {}
    for name, shape in hf_shapes.items():
        if name in engine:
            out[name] = Slot(name, None, 0, _rows(shape))
        else:
            out[name] = expert_slot(name, hf_shapes, experts) or fused_slot(name, hf_shapes, engine)
    return out


def held_view(param: torch.Tensor, slot: Slot) -> torch.Tensor:
    """The part of the engine parameter `slot` names."""
    view = param[slot.expert] if slot.expert is not None else param
    return view if view.dim() == 0 else view[slot.start : slot.stop]


def engine_dtypes(params: dict[str, torch.Tensor]) -> list[str]:
    """The dtypes the engine's parameters hold (a served tensor is hashed cast to each: the buffers are reused)."""
    return sorted({str(p.dtype) for p in params.values()})


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name.removeprefix("torch."))


def expected_held(batch: Iterable[tuple[str, torch.Tensor]], dtypes: list[str]) -> dict[str, dict]:
    """Per received tensor: its shape and, per engine dtype, [digest of its cast, whether the cast is exact]."""
    out = {}
    for name, tensor in batch:
        casts = {}
        for dtype in dtypes:
            cast = tensor.to(_dtype(dtype)) if tensor.is_floating_point() else tensor
            exact = cast.dtype == tensor.dtype or torch.equal(cast.to(tensor.dtype), tensor)
            casts[dtype] = [tensor_digests([(name, cast)])[name], bool(exact)]
        out[name] = {"shape": list(tensor.shape), "casts": casts}
    return out


def verdict(held: torch.Tensor | None, expected: dict) -> str:
    """equal / rounded / wrong for one tensor (`held`: the engine rows that must hold it, None: none do)."""
    if held is None or list(held.shape) != expected["shape"] or str(held.dtype) not in expected["casts"]:
        return "wrong"
    digest, exact = expected["casts"][str(held.dtype)]
    if tensor_digests([("held", held)])["held"] != digest:
        return "wrong"
    return "equal" if exact else "rounded"


def held_verdicts(params: dict[str, torch.Tensor], expected: dict[str, dict]) -> dict[str, str]:
    """Served name -> equal / rounded / wrong, from the engine's live parameters (`params`, engine names)."""
    shapes = {name: tuple(e["shape"]) for name, e in expected.items()}
    slots = engine_slots(shapes, set(params))
    return {
        name: verdict(None if slot is None else held_view(params[slot.param], slot), expected[name])
        for name, slot in slots.items()
    }


def held_counts(verdicts: dict[str, str]) -> dict[str, int]:
    """How many served tensors the engine holds equal, rounded and wrong."""
    counts = Counter(verdicts.values())
    return {v: counts.get(v, 0) for v in VERDICTS}


def check_held(verdicts: dict[str, str]) -> dict[str, int]:
    """`held_counts`, or PushVerificationError naming the first tensor the engine holds wrong."""
    wrong = sorted(name for name, v in verdicts.items() if v == "wrong")
    if wrong:
        raise PushVerificationError(
            f"tensor {wrong[0]!r}: the engine's parameters hold neither the served tensor nor its cast to the "
            f"engine's dtype ({len(wrong)} of {len(verdicts)} tensors wrong): its loader mapped it elsewhere, or "
            "no engine parameter holds it"
        )
    return held_counts(verdicts)
