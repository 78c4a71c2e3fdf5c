"""Benchmark: our Muon step vs torch.optim.Muon, and Newton-Schulz cost vs a training step.

Run: `python benchmarks/muon_step.py [--quick | --smoke] [--threads N]`

1. Step time of `MuonClip` (Muon groups only; default `ns_dtype: auto`, i.e. fp32 Newton-Schulz on
   CPU, and `ns_dtype: bfloat16`, torch's numerics) and `torch.optim.Muon(adjust_lr_fn=
   "match_rms_adamw")` on the same 2-D matrices with the same grads, interleaved repeats
   (the order rotates), median seconds. ratio = ours / torch; ratio_bf16 = ours in bf16 / torch
   (its params must equal torch's: max |param diff|). On a CPU without native bf16 GEMMs (AVX2
   only) bf16 NS is ~20x slower than fp32, which is why `auto` is fp32 on CPU.
2. Newton-Schulz time (all Muon matrices of a model, batched as `MuonClip.step` does) as a
   fraction of one forward+backward pass, for tiny-qwen2 (8 x 256 tokens) and for a ~100M
   Qwen2 (hidden 768, 12 layers, 12 heads, MLP 3072, vocab 32000; 4 x 512 tokens).
   `--quick` shrinks the matrix list, tiny-qwen2's (one layer), the big model (2 layers) and its batch (2 x 256).
   `--smoke` shrinks them to the least that runs every measurement once (the test suite's check that the script
   runs end to end; its figures mean nothing): 4 small matrices, tiny-qwen2 on 2 x 64 tokens, a 1-layer big model
   on 1 x 64 tokens, one timed repeat each.

Prints a table, then exactly one JSON line:
{"ours_s": .., "ours_bf16_s": .., "torch_s": .., "ratio": .., "ratio_bf16": .., "ns_overhead_tiny": .., ...}

NS runs once per optimizer step, fwd+bwd once per token: the overhead at the measured
micro-batch is an upper bound; the table also gives it at 64k tokens per step (64 prompts x
8 samples x 128 tokens) and the step size at which it falls to 3%.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
from _timing import wall_times
from torch import nn

from k2post.optim.config import OptimConfig
from k2post.optim.muon import MuonClip, build_optimizer, orthogonalize_many
from k2post.optim.newton_schulz import ns_compute_dtype
from k2post.optim.param_groups import build_param_groups

FULL_SHAPES = [(1024, 4096)] * 8 + [(4096, 1024)] * 8 + [(1024, 1024)] * 8
QUICK_SHAPES = [(128, 512)] * 4 + [(512, 128)] * 4 + [(128, 128)] * 4
SMOKE_SHAPES = [(32, 64), (64, 32), (32, 32), (32, 32)]
# tiny-qwen2's Muon matrices (4 layers): q/o [256, 256], k/v [128, 256], MLP [512, 256] / [256, 512].
TINY_SHAPES = ([(256, 256)] * 2 + [(128, 256)] * 2 + [(512, 256)] * 2 + [(256, 512)]) * 4


def _median_time(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    """Median wall time of `fn` over `repeats` calls after `warmup` untimed calls."""
    return statistics.median(wall_times(fn, repeats, warmup))


ParamSets = tuple[list[nn.Parameter], list[nn.Parameter], list[torch.Tensor]]


def _params_and_grads(shapes: list[tuple[int, int]]) -> ParamSets:
    """Two identical sets of params (ours, torch's) and one shared set of grads."""
    gen = torch.Generator().manual_seed(0)
    ours = [nn.Parameter(torch.randn(shape, generator=gen) * 0.02) for shape in shapes]
    theirs = [nn.Parameter(p.detach().clone()) for p in ours]
    grads = [torch.randn(shape, generator=gen) for shape in shapes]
    for p, q, g in zip(ours, theirs, grads):
        p.grad, q.grad = g, g  # optimizers read grads, never write them
    return ours, theirs, grads


def bench_step(shapes: list[tuple[int, int]], repeats: int) -> dict[str, float]:
    """Median step seconds of MuonClip (default and bf16 NS) and torch.optim.Muon on `shapes`, interleaved."""
    ours, theirs, _ = _params_and_grads(shapes)
    ours_bf16 = [nn.Parameter(p.detach().clone()) for p in ours]
    for p, q in zip(ours_bf16, ours):
        p.grad = q.grad.clone()
    cfg = OptimConfig(lr=1e-3, weight_decay=0.1)
    opt_torch = torch.optim.Muon(
        theirs,
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        momentum=cfg.momentum,
        nesterov=cfg.nesterov,
        ns_steps=cfg.ns_steps,
        adjust_lr_fn="match_rms_adamw",
    )
    runs = {
        "ours": MuonClip([{"params": ours, "use_muon": True}], cfg).step,
        "ours_bf16": MuonClip(
            [{"params": ours_bf16, "use_muon": True}], cfg.model_copy(update={"ns_dtype": "bfloat16"})
        ).step,
        "torch": opt_torch.step,
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for name in runs:  # warm-up: creates momentum buffers, primes allocators/kernels
        runs[name]()
    names = list(runs)
    for i in range(repeats):
        for name in names[i % 3 :] + names[: i % 3]:
            start = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - start)
    max_diff = max((p - q).abs().max().item() for p, q in zip(ours_bf16, theirs))
    return {f"{name}_s": statistics.median(t) for name, t in times.items()} | {"max_param_diff": max_diff}


def _ns_all(model: nn.Module, cfg: OptimConfig) -> Callable[[], None]:
    """A function orthogonalizing random directions of every Muon param of `model`, batched by shape."""
    muon = [g for g in build_param_groups(model, cfg) if g["use_muon"]]
    params = muon[0]["params"] if muon else []
    by_shape: dict[tuple, list[torch.Tensor]] = {}
    for p in params:
        by_shape.setdefault(tuple(p.shape[-2:]), []).append(torch.randn_like(p))

    dtype = ns_compute_dtype(cfg.ns_dtype, params[0].device) if params else torch.float32

    def run() -> None:
        for directions in by_shape.values():
            orthogonalize_many(directions, cfg.ns_steps, cfg.ns_eps, dtype)

    return run


def _fwd_bwd(model: nn.Module, batch: int, seq: int, vocab: int) -> Callable[[], None]:
    """A function running one forward+backward (LM loss) on a fixed random batch."""
    tokens = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))

    def run() -> None:
        model.zero_grad(set_to_none=True)
        model(input_ids=tokens, labels=tokens).loss.backward()

    return run


def bench_overhead(model: nn.Module, batch: int, seq: int, repeats: int) -> dict[str, float]:
    """NS time, full optimizer step time and fwd+bwd time of `model`."""
    cfg = OptimConfig()
    vocab = model.config.vocab_size
    fwd_bwd = _fwd_bwd(model, batch, seq, vocab)
    fb_s = _median_time(fwd_bwd, repeats)
    ns_s = _median_time(_ns_all(model, cfg), repeats)
    opt = build_optimizer(model, cfg)
    step_s = _median_time(opt.step, repeats)
    n_muon = sum(p.numel() for g in opt.param_groups if g["use_muon"] for p in g["params"])
    return {
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "muon_params_m": n_muon / 1e6,
        "tokens": batch * seq,
        "fwd_bwd_s": fb_s,
        "ns_s": ns_s,
        "opt_step_s": step_s,
        "ns_overhead": ns_s / fb_s,
        **amortized(ns_s, fb_s, batch * seq),
    }


def amortized(ns_s: float, fwd_bwd_s: float, tokens: int) -> dict[str, float]:
    """NS runs once per optimizer step while fwd+bwd grows with the tokens in the step
    (micro-batches accumulate): the overhead at a realistic step size, and the step size
    at which it falls to 3%."""
    per_token_s = fwd_bwd_s / tokens
    return {
        "ns_overhead_64k": ns_s / (per_token_s * STEP_TOKENS_REALISTIC),
        "tokens_for_3pct": ns_s / (0.03 * per_token_s),
    }


# One RL step of the demo's shape at scale: 64 prompts x 8 samples x 128 tokens.
STEP_TOKENS_REALISTIC = 64 * 8 * 128


def tiny_model() -> nn.Module:
    """tiny-qwen2 as the project builds it (seed 0)."""
    from k2post.models.init import build_flavor_config, build_model
    from k2post.models.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    return build_model(build_flavor_config("tiny-qwen2", tokenizer), 0, len(tokenizer))


def qwen2_100m(layers: int) -> nn.Module:
    """A ~100M-class Qwen2 (hidden 768, 12 heads, MLP 3072, vocab 32000, tied embeddings), random init."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        hidden_size=768,
        num_hidden_layers=layers,
        num_attention_heads=12,
        num_key_value_heads=12,
        intermediate_size=3072,
        vocab_size=32000,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config)


def _print_tables(step: dict, shapes: list, overheads: dict[str, dict]) -> None:
    """Human-readable results."""
    print(
        f"## Muon step on {len(shapes)} matrices ({sum(n * m for n, m in shapes) / 1e6:.1f}M params; "
        f"{sorted(set(shapes))})"
    )
    print("| impl | median step (s) |\n| --- | --- |")
    print(
        f"| ours (MuonClip, ns_dtype auto) | {step['ours_s']:.4f} |\n"
        f"| ours (ns_dtype bfloat16) | {step['ours_bf16_s']:.4f} |"
    )
    print(f"| torch.optim.Muon | {step['torch_s']:.4f} |")
    print(
        f"ratio ours/torch = {step['ours_s'] / step['torch_s']:.3f}, "
        f"bf16 ours/torch = {step['ours_bf16_s'] / step['torch_s']:.3f}; "
        f"max |param diff| bf16 ours vs torch after all steps = {step['max_param_diff']:.3g}\n"
    )
    print("## Newton-Schulz vs forward+backward")
    print(
        "| model | params (M) | Muon params (M) | tokens | fwd+bwd (s) | NS (s) | full opt step (s) | NS / fwd+bwd "
        "| NS / fwd+bwd at 64k tokens/step | tokens/step for 3% |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, r in overheads.items():
        print(
            f"| {name} | {r['params_m']:.1f} | {r['muon_params_m']:.1f} | {r['tokens']} | {r['fwd_bwd_s']:.3f} | "
            f"{r['ns_s']:.4f} | {r['opt_step_s']:.4f} | {r['ns_overhead']:.4f} | {r['ns_overhead_64k']:.4f} "
            f"| {r['tokens_for_3pct']:.0f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small matrices and a 2-layer big model")
    parser.add_argument(
        "--smoke", action="store_true", help="the least run of every measurement (the test suite's; no figures)"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (the dev machine has 2 cores)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.smoke:
        shapes, repeats, tiny_shapes, tiny_repeats = SMOKE_SHAPES, 1, TINY_SHAPES[:2], 1
        tiny_batch, tiny_seq, tiny_fb_repeats = 2, 64, 1
        big_layers, big_batch, big_seq, big_repeats = 1, 1, 64, 1
    else:
        shapes, repeats = (QUICK_SHAPES, 3) if args.quick else (FULL_SHAPES, 5)
        tiny_shapes = TINY_SHAPES[:7] if args.quick else TINY_SHAPES  # quick: one layer's matrices
        tiny_repeats = 3 if args.quick else 20
        tiny_batch, tiny_seq, tiny_fb_repeats = 8, 256, 3
        big_layers, big_batch, big_seq = (2, 2, 256) if args.quick else (12, 4, 512)
        big_repeats = 1 if args.quick else 2
    step = bench_step(shapes, repeats=repeats)
    step_tiny = bench_step(tiny_shapes, repeats=tiny_repeats)
    overheads = {"tiny-qwen2": bench_overhead(tiny_model(), tiny_batch, tiny_seq, repeats=tiny_fb_repeats)}
    big_name = f"qwen2-{big_layers}L-768"
    overheads[big_name] = bench_overhead(qwen2_100m(big_layers), big_batch, big_seq, repeats=big_repeats)
    _print_tables(step, shapes, overheads)
    print(
        f"\n## Muon step on tiny-qwen2's {len(tiny_shapes)} matrices: ours {step_tiny['ours_s']:.4f} s, "
        f"torch {step_tiny['torch_s']:.4f} s, ratio {step_tiny['ours_s'] / step_tiny['torch_s']:.3f}"
    )
    print(
        json.dumps(
            {
                "ours_s": round(step["ours_s"], 5),
                "ours_bf16_s": round(step["ours_bf16_s"], 5),
                "torch_s": round(step["torch_s"], 5),
                "ratio": round(step["ours_s"] / step["torch_s"], 4),
                "ratio_bf16": round(step["ours_bf16_s"] / step["torch_s"], 4),
                "max_param_diff_bf16": step["max_param_diff"],
                "ratio_tiny_shapes": round(step_tiny["ours_s"] / step_tiny["torch_s"], 4),
                "ns_overhead_tiny": round(overheads["tiny-qwen2"]["ns_overhead"], 5),
                "ns_overhead_100m": round(overheads[big_name]["ns_overhead"], 5),
                "ns_overhead_100m_64k_tokens": round(overheads[big_name]["ns_overhead_64k"], 5),
                "tokens_per_step_for_3pct_100m": round(overheads[big_name]["tokens_for_3pct"]),
            }
        )
    )


if __name__ == "__main__":
    main()
