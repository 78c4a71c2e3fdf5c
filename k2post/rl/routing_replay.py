"""MoE routing replay: the trainer routes each token to the experts the rollout engine routed it to.

A MoE model's top-k choice is discontinuous: a bf16 engine and an fp32 trainer with the same weights pick
different experts for a few percent of the tokens, and those tokens' log-probs then differ by far more than
the numerics alone would make them. With `routing_replay: true` the engine records its choice per token and
MoE layer (`k2post/rollout/routing_capture.py`), episodes carry it (`Episode.routing`, int16
[tokens, moe_layers, top_k], -1 where nothing was recorded) and the trainer's forward for pi_old and for the
loss uses those experts. The gate weights are recomputed by the trainer from its own router scores at the
forced experts, so the router still gets a gradient.

    replay = RoutingReplay(model)                          # finds the MoE gates (DeepSeek-V3 / K2 layout)
    with replay.forcing(recorded_BTLK, valid_BT, replay=True) as stats:
        logits = model(input_ids=ids).logits
    stats.tokens, stats.disagree, stats.disagree_used      # per token: own top-k != engine's; used != engine's

Pure pieces (`replayed_weights`, `forced_indices`, `top_k_differs`) are tested in
tests/k2post/rl/test_routing_replay.py; the trainer (`k2post/rl/trainer.py`) calls this class.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch


class RoutingReplayError(ValueError):
    """The model has no MoE gates this replay understands, or the recorded routing does not fit it."""


def replayed_weights(
    router_logits: torch.Tensor, indices: torch.Tensor, norm_topk_prob: bool, scale: float
) -> torch.Tensor:
    """Gate weights of the experts `indices` from sigmoid router scores (DeepSeek-V3 noaux_tc: bias only picks,
    the weights come from the raw scores), normalized over the k when `norm_topk_prob`, times `scale`.
    [N, E] logits, [N, k] indices -> [N, k]."""
    weights = router_logits.float().sigmoid().gather(1, indices.long())
    if norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * scale


def forced_indices(own: torch.Tensor, recorded: torch.Tensor, replay_rows: torch.Tensor) -> torch.Tensor:
    """The recorded experts on `replay_rows`, the model's own elsewhere. [N, k], [N, k], bool [N] -> [N, k]."""
    return torch.where(replay_rows[:, None], recorded.to(own.dtype), own)


def top_k_differs(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """Rows whose sets of k experts differ (order ignored). [N, k], [N, k] -> bool [N]."""
    return (first.sort(dim=-1).values != second.to(first.dtype).sort(dim=-1).values).any(dim=-1)


@dataclass
class RoutingStats:
    """Counts over the tokens that had a recorded routing: own choice != engine's (in any MoE layer), and the
    experts actually used != engine's (0 when replaying)."""

    tokens: int = 0
    disagree: int = 0
    disagree_used: int = 0

    def add(self, other: "RoutingStats") -> None:
        self.tokens += other.tokens
        self.disagree += other.disagree
        self.disagree_used += other.disagree_used


def moe_gates(model: Any) -> dict[int, torch.nn.Module]:
    """Decoder layer index -> its MoE gate, for DeepSeek-V3-layout models (`layers[i].mlp.gate` next to
    `mlp.experts`, the gate returning (router_logits, weights, indices))."""
    layers = getattr(getattr(model, "model", model), "layers", None)
    if layers is None:
        return {}
    gates = {}
    for index, layer in enumerate(layers):
        mlp = getattr(layer, "mlp", None)
        gate = getattr(mlp, "gate", None)
        if hasattr(mlp, "experts") and hasattr(gate, "top_k") and hasattr(gate, "routed_scaling_factor"):
            gates[index] = gate
    return gates


class RoutingReplay:
    """Forward hooks on every MoE gate of `model` that replay recorded expert choices."""

    def __init__(self, model: Any) -> None:
        self.gates = moe_gates(model)
        if not self.gates:
            raise RoutingReplayError(
                f"routing_replay: {type(model).__name__} has no DeepSeek-V3-style MoE gates (mlp.gate + mlp.experts); "
                "use a MoE model such as the tiny-k2 flavor, or set routing_replay: false"
            )
        self.layers = sorted(self.gates)
        self.top_k = int(next(iter(self.gates.values())).top_k)

    def _hook(self, slot: int, recorded: torch.Tensor, have: torch.Tensor, replay: bool, acc: dict[str, torch.Tensor]):
        def hook(gate: Any, _inputs: Any, output: tuple[torch.Tensor, torch.Tensor, torch.Tensor]):
            logits, weights, own = output
            rows = recorded[:, slot].to(own.device)
            acc["disagree"] |= top_k_differs(own, rows) & have
            if not replay:
                return None
            used = forced_indices(own, rows, have)
            acc["used"] |= top_k_differs(used, rows) & have
            new_weights = replayed_weights(logits, used, bool(gate.norm_topk_prob), float(gate.routed_scaling_factor))
            return logits, new_weights.to(weights.dtype), used

        return hook

    @contextlib.contextmanager
    def forcing(
        self, recorded: torch.Tensor | None, valid: torch.Tensor, replay: bool = True
    ) -> Iterator[RoutingStats]:
        """Hooks for one forward over a batch: `recorded` int [B, T, moe_layers, top_k] (-1: none), `valid` bool
        [B, T] (real tokens). Yields the batch's RoutingStats (filled when the block ends)."""
        stats = RoutingStats()
        if recorded is None:
            yield stats
            return
        if recorded.shape[2:] != (len(self.layers), self.top_k) or recorded.shape[:2] != valid.shape:
            raise RoutingReplayError(
                f"recorded routing of shape {tuple(recorded.shape)} does not fit a batch of {tuple(valid.shape)} "
                f"tokens x {len(self.layers)} MoE layers x top-{self.top_k} (engine and trainer must run one model)"
            )
        flat = recorded.reshape(-1, len(self.layers), self.top_k)  # [B*T, L, k]
        have = (flat >= 0).all(dim=-1).all(dim=-1) & valid.reshape(-1).to(flat.device)  # [B*T]
        acc = {"disagree": torch.zeros_like(have), "used": torch.zeros_like(have)}
        handles = [
            self.gates[layer].register_forward_hook(self._hook(slot, flat, have, replay, acc))
            for slot, layer in enumerate(self.layers)
        ]
        try:
            yield stats
        finally:
            for handle in handles:
                handle.remove()
        stats.tokens, stats.disagree = int(have.sum()), int(acc["disagree"].sum())
        stats.disagree_used = int(acc["used"].sum()) if replay else stats.disagree


def recorded_batch(routings: list[Any], width: int, layers: int, top_k: int) -> torch.Tensor | None:
    """Right-pad each row's recorded routing (int16 [T_i, L, k] or None) to `width` with -1: int16 [B, W, L, k];
    None when no row has one."""
    if all(routing is None for routing in routings):
        return None
    out = torch.full((len(routings), width, layers, top_k), -1, dtype=torch.int16)
    for row, routing in enumerate(routings):
        if routing is not None:
            tensor = torch.tensor(routing, dtype=torch.int16)[:width]  # a copy: Ray hands over read-only arrays
            out[row, : tensor.shape[0]] = tensor
    return out
