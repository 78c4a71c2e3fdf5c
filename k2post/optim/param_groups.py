"""Which parameters Muon updates and which AdamW updates (K2's split).

Rules of `route_param`, in order:
- more than 3 dims: AdamW if a name pattern in `cfg.adamw_patterns` matches, else an error
  (Muon understands matrices [n, m] and batches of them [E, n, m] only);
- a name matching both `cfg.muon_patterns` and `cfg.adamw_patterns`: an error;
- a name matching `cfg.muon_patterns`: Muon, and an error if the param is 0-D or 1-D;
- 0-D and 1-D params (norm weights, biases): AdamW;
- a name matching `cfg.adamw_patterns` (embeddings, lm_head, router bias): AdamW;
- 2-D hidden matrices and 3-D fused expert weights: Muon.

`build_param_groups(model, cfg)` turns this into (at most) two optimizer param groups tagged
`use_muon`, and `describe_routing(model, cfg)` renders the decision as a table for logs.
Buffers (e.g. DeepSeek-V3's `e_score_correction_bias`) are not parameters and are never routed.

Tests: `python -m pytest tests/k2post/optim/test_param_groups.py -q`.
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor, nn

from k2post.optim.config import OptimConfig

Route = Literal["muon", "adamw"]


class ParamSpecError(ValueError):
    """A parameter cannot be routed as configured (wrong shape for Muon, conflicting patterns)."""


def _matches(name: str, patterns: list[str]) -> list[str]:
    """The patterns (name substrings) that occur in `name`."""
    return [pattern for pattern in patterns if pattern in name]


def _check_forced_muon(name: str, shape: tuple[int, ...], forced: list[str], cfg: OptimConfig) -> None:
    """Raise if a param forced to Muon by `muon_patterns` cannot be orthogonalized."""
    clash = _matches(name, cfg.adamw_patterns)
    if clash:
        raise ParamSpecError(
            f"param {name!r} (shape {shape}) matches muon_patterns {forced} and adamw_patterns {clash}: "
            "make the patterns specific enough that each param matches one list"
        )
    if len(shape) < 2:
        raise ParamSpecError(
            f"param {name!r} has shape {shape} ({len(shape)}-D) but muon_patterns {forced} force it to Muon, "
            "which only orthogonalizes 2-D matrices and 3-D stacks of them: make the pattern more specific "
            "(e.g. end it with '.weight' of a linear layer) or remove it; norms and biases must use AdamW"
        )


def route_param(name: str, param: Tensor, cfg: OptimConfig) -> Route:
    """ "muon" or "adamw" for the parameter `name` (see the module docstring for the rules)."""
    shape = tuple(param.shape)
    if param.ndim > 3:
        if _matches(name, cfg.adamw_patterns):
            return "adamw"
        raise ParamSpecError(
            f"param {name!r} has shape {shape} ({param.ndim}-D): Muon takes 2-D matrices or 3-D stacks of "
            "them; reshape it in the model or add a substring of its name to optim.adamw_patterns"
        )
    forced = _matches(name, cfg.muon_patterns)
    if forced:
        _check_forced_muon(name, shape, forced, cfg)
        return "muon"
    if param.ndim <= 1 or _matches(name, cfg.adamw_patterns):
        return "adamw"
    return "muon"


def row_splits(name: str, shape: tuple[int, ...], cfg: OptimConfig) -> int:
    """How many matrices a Muon param stacks along its rows (`cfg.fused_row_splits`; 1 = one matrix per [n, m]).

    A fused MoE `gate_up_proj` [E, 2I, H] is 2 per expert: gate rows [0, I) and up rows [I, 2I)."""
    hits = [k for key, k in cfg.fused_row_splits.items() if key in name]
    if not hits:
        return 1
    if len(set(hits)) > 1:
        raise ParamSpecError(
            f"param {name!r} matches optim.fused_row_splits keys with different counts {hits}: make them specific"
        )
    k = hits[0]
    if len(shape) < 2 or shape[-2] % k:
        raise ParamSpecError(
            f"param {name!r} has shape {shape}: optim.fused_row_splits says it stacks {k} matrices along its rows, "
            f"but {shape[-2] if len(shape) >= 2 else 'no'} rows do not split into {k}; fix the pattern or the count"
        )
    return k


def build_param_groups(model: nn.Module, cfg: OptimConfig) -> list[dict]:
    """Param groups for `MuonClip`: the Muon group first, then AdamW; empty groups are left out.

    Each group is {"params": [...], "names": [...], "use_muon": bool}. Frozen params
    (requires_grad False) are skipped; tied params appear once (named_parameters dedups).
    """
    groups = {
        "muon": {"params": [], "names": [], "use_muon": True},
        "adamw": {"params": [], "names": [], "use_muon": False},
    }
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        group = groups[route_param(name, param, cfg)]
        group["params"].append(param)
        group["names"].append(name)
    return [group for group in groups.values() if group["params"]]


def _routing_rows(model: nn.Module, cfg: OptimConfig) -> list[tuple[str, str, str, int]]:
    """(name, shape, route, numel) for every parameter; frozen ones are routed "frozen"."""
    rows = []
    for name, param in model.named_parameters():
        route = route_param(name, param, cfg) if param.requires_grad else "frozen"
        rows.append((name, "x".join(map(str, param.shape)) or "scalar", route, param.numel()))
    return rows


def describe_routing(model: nn.Module, cfg: OptimConfig) -> str:
    """A fixed-width table of every parameter's route and the totals per route, for logs."""
    rows = _routing_rows(model, cfg)
    width = max([len("param")] + [len(row[0]) for row in rows])
    lines = [f"{'param':<{width}}  {'shape':>16}  {'optim':<6}  {'numel':>12}"]
    lines += [f"{name:<{width}}  {shape:>16}  {route:<6}  {numel:>12,}" for name, shape, route, numel in rows]
    totals: dict[str, tuple[int, int]] = {}
    for _, _, route, numel in rows:
        count, total = totals.get(route, (0, 0))
        totals[route] = (count + 1, total + numel)
    for route, (count, total) in sorted(totals.items()):
        lines.append(f"total {route}: {count} tensors, {total:,} params")
    return "\n".join(lines)
