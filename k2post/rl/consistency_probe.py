"""How far a rollout engine's log-probs are from the trainer's on the same sampled tokens, with and without
routing replay: what tests/k2post/rollout/test_train_inference_consistency.py checks and
benchmarks/rl_consistency.py reports.

    gens = [g for out in engine.generate(prompts, sampling) for g in out]      # engine with record_routing
    report = probe(model, gens, ISCorrectionConfig(enabled=True), temperature=0.7)  # model: the fp32 trainer model
    report["no_replay"]["consistency/kl"], report["replay"]["routing/disagree_used"], report["is"]["max_weight"]

The trainer side runs the same pieces the RL trainer does (`RoutingReplay.forcing`, `temper` at the sampling
temperature, `shifted_logprobs`, `masked_token_lists`) one generation at a time, and the figures come from
`consistency.consistency_metrics`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from typing import Any

import torch

from k2post.rl.config import ISCorrectionConfig
from k2post.rl.consistency import consistency_metrics, is_weights
from k2post.rl.losses import masked_token_lists, shifted_logprobs, temper
from k2post.rl.routing_replay import RoutingReplay, RoutingStats, moe_gates


@torch.no_grad()
def trainer_token_logprobs(
    model: Any, generations: Sequence[Any], replay: RoutingReplay | None, force: bool, temperature: float = 1.0
) -> tuple[list[list[float]], RoutingStats]:
    """The model's log-prob of every generated token (given prompt and earlier tokens) under softmax(logits / T);
    with `replay`, the engine's recorded routing is compared with the model's and, with `force`, used."""
    out, stats = [], RoutingStats()
    for gen in generations:
        ids = torch.tensor([list(gen.prompt_ids) + list(gen.token_ids)])  # [1, T]
        mask = torch.zeros(ids.shape)
        mask[0, len(gen.prompt_ids) :] = 1
        recorded = None
        if replay is not None and gen.routed_experts is not None:
            recorded = torch.as_tensor(gen.routed_experts, dtype=torch.int16)[None]
        valid = torch.ones(ids.shape, dtype=torch.bool)
        forcing = replay.forcing(recorded, valid, force) if replay else contextlib.nullcontext(RoutingStats())
        with forcing as s:
            logits = model(input_ids=ids, use_cache=False).logits
        stats.add(s)
        out.extend(masked_token_lists(shifted_logprobs(temper(logits, temperature), ids), mask))
    return out, stats


def _variant(old: list[list[float]], generations: Sequence[Any], stats: RoutingStats) -> dict[str, float]:
    behaviour = [list(g.logprobs) for g in generations]
    row = consistency_metrics(old, behaviour, [[0] * len(b) for b in behaviour], 0, [True] * len(old))
    if stats.tokens:
        row["routing/disagree"] = stats.disagree / stats.tokens
        row["routing/disagree_used"] = stats.disagree_used / stats.tokens
    return row


def is_report(old: list[list[float]], generations: Sequence[Any], cfg: ISCorrectionConfig) -> dict[str, float]:
    """What the IS correction does to these rows: largest token weight, the share of sequences masked, the
    largest |log-ratio - 1| of a weight (noise: 0 for equal policies), and how many kept sequences lie outside
    both mask bands (0: the mask does what it says)."""
    weights, masked, outside = [], 0, 0
    for tokens, gen in zip(old, generations):
        w, keep = is_weights(tokens, list(gen.logprobs), cfg)
        weights.extend(w)
        masked += not keep
        total = sum(tokens) - sum(gen.logprobs)
        mean = total / max(len(tokens), 1)
        in_geo = math.log(cfg.mask_low) <= mean <= math.log(cfg.mask_high)
        outside += keep and not in_geo and abs(total) > math.log(cfg.mask_product_band)
    return {
        "max_weight": max(weights, default=1.0),
        "weight_dev_max": max((abs(x - 1.0) for x in weights), default=0.0),
        "masked_share": masked / max(len(old), 1),
        "kept_outside_bands": float(outside),
    }


def probe(
    model: Any, generations: Sequence[Any], cfg: ISCorrectionConfig, temperature: float = 1.0
) -> dict[str, dict[str, float]]:
    """{"no_replay": ..., "replay": ... (MoE models with recorded routing), "is": ...} for `generations` sampled at
    `temperature` (the trainer side tempers its logits the same way)."""
    replay = RoutingReplay(model) if moe_gates(model) else None
    old, stats = trainer_token_logprobs(model, generations, replay, False, temperature)
    report = {"no_replay": _variant(old, generations, stats), "is": is_report(old, generations, cfg)}
    if replay is not None and any(g.routed_experts is not None for g in generations):
        replayed, replay_stats = trainer_token_logprobs(model, generations, replay, True, temperature)
        report["replay"] = _variant(replayed, generations, replay_stats)
    return report
