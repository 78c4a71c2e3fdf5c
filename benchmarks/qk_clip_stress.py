"""QK-Clip stress demo: plain Muon vs MuonClip on a small attention LM with an aggressive lr.

Trains the same model (same seed, same synthetic batches) twice with `build_optimizer`
(k2post/optim/muon.py): once without QK-Clip (the max logit is only recorded) and once with
`QKClip.after_step()` after every optimizer step. Writes `max_logit_vs_step.png` (max
pre-softmax logit per step with the tau line, and the loss curves) and `history.json` to
--out, prints a table and, as its last line, one JSON object with the peaks and final losses.

Data: a copy task (random tokens, then the same tokens again), which rewards sharp
induction-style attention, so attention logits grow quickly under a high learning rate.

    python benchmarks/qk_clip_stress.py                      # ~1-2 min on 2 CPU cores
    python benchmarks/qk_clip_stress.py --cost               # recording overhead (fwd, fwd+bwd)

`--cost` times forward (no_grad) and forward+backward of tiny-qwen2 and tiny-k2 at
batch 8 x 256 with plain sdpa vs the recording attention, and prints a table plus one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from _timing import wall_times
from transformers import AutoModelForCausalLM, PreTrainedModel

from k2post.models.flavors import flavor_config
from k2post.optim.config import OptimConfig, QKClipConfig
from k2post.optim.qk_clip import MaxLogitRecorder, QKClip, compute_qk_clip_stats, per_head_max_logit

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (defaults: the configuration reported in docs/QK_CLIP.md)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=["small-qwen2", "tiny-k2"], default="small-qwen2")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--tau", type=float, default=30.0)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=64, help="sequence length (half random, half copy)")
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "qk_clip_stress")
    p.add_argument("--cost", action="store_true", help="measure the recording overhead instead")
    return p.parse_args(argv)


def build_lm(name: str, vocab: int, seed: int) -> PreTrainedModel:
    """small-qwen2: tiny-qwen2 with 2 layers (GQA, 4 q heads / 2 kv heads); tiny-k2: the MLA flavor."""
    config = flavor_config("tiny-qwen2" if name == "small-qwen2" else "tiny-k2", vocab)
    if name == "small-qwen2":
        config.num_hidden_layers = 2
    config.pad_token_id = 0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.train()


def copy_batches(steps: int, batch: int, seq: int, vocab: int, seed: int) -> list[torch.Tensor]:
    """`steps` batches [batch, seq]: seq/2 random tokens (ids >= 1) followed by the same tokens."""
    gen = torch.Generator().manual_seed(seed + 1000)
    half = seq // 2
    out = []
    for _ in range(steps):
        first = torch.randint(1, vocab, (batch, half), generator=gen)
        out.append(torch.cat([first, first], dim=1))
    return out


def copy_loss(model: PreTrainedModel, ids: torch.Tensor) -> torch.Tensor:
    """Next-token loss on the copied half only (the first half is unpredictable noise)."""
    labels = ids.clone()
    labels[:, : ids.shape[1] // 2] = -100
    return model(input_ids=ids, labels=labels).loss


def train(args: argparse.Namespace, clip: bool, batches: list[torch.Tensor]) -> dict[str, list[float]]:
    """One run; returns per-step max logit (recorded in the step's forward), loss and #clipped heads."""
    from k2post.optim.muon import build_optimizer

    model = build_lm(args.model, args.vocab, args.seed)
    cfg = OptimConfig(
        lr=args.lr, weight_decay=args.weight_decay, qk_clip=QKClipConfig(enabled=clip, logit_threshold=args.tau)
    )
    optimizer = build_optimizer(model, cfg)
    qk_clip = QKClip(model, cfg.qk_clip) if clip else None
    recorder = None if clip else MaxLogitRecorder().attach(model)  # baseline: record only
    hist: dict[str, list[float]] = {"max_logit": [], "loss": [], "num_clipped": []}
    for step, ids in enumerate(batches):
        loss = copy_loss(model, ids)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if qk_clip is not None:
            stats = qk_clip.after_step()
        else:
            stats = compute_qk_clip_stats(recorder.per_head(), args.tau)
            recorder.reset()
        hist["max_logit"].append(stats.max_logit)
        hist["loss"].append(loss.item())
        hist["num_clipped"].append(stats.num_clipped if clip else 0)
        if step % 25 == 0 or step == len(batches) - 1:
            print(
                f"  [{'muonclip' if clip else 'muon'}] step {step:4d} loss {loss.item():.4f} "
                f"max_logit {stats.max_logit:8.2f} clipped {stats.num_clipped}/{stats.num_heads}",
                flush=True,
            )
    (qk_clip.close() if qk_clip is not None else recorder.detach())
    return hist


def plot(muon: dict, muonclip: dict, tau: float, path: Path) -> None:
    """Two panels: max logit per step (with tau) and loss per step, for both runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    ax1.plot(muon["max_logit"], label="Muon (no clip)", color="tab:red")
    ax1.plot(muonclip["max_logit"], label="MuonClip", color="tab:blue")
    ax1.axhline(tau, color="black", linestyle="--", linewidth=1, label=f"tau = {tau:g}")
    ax1.set(
        xlabel="step",
        ylabel="max attention logit (all layers, heads)",
        title="Max pre-softmax logit (each step's forward, before its clip)",
    )
    ax1.legend()
    ax1.grid(alpha=0.3)
    ax2.plot(muon["loss"], label="Muon (no clip)", color="tab:red", alpha=0.8)
    ax2.plot(muonclip["loss"], label="MuonClip", color="tab:blue", alpha=0.8)
    ax2.set(xlabel="step", ylabel="copy-task loss", title="Training loss", yscale="log")
    ax2.legend()
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def require_muon() -> None:
    """Fail with a clear message when k2post/optim/muon.py (build_optimizer) is missing."""
    try:
        from k2post.optim.muon import build_optimizer  # noqa: F401
    except ImportError as err:
        sys.exit(f"k2post.optim.muon.build_optimizer is not available ({err}); the stress demo needs MuonClip")


def stress(args: argparse.Namespace) -> dict:
    """Run both trainings, write PNG + history, print the table; return the summary dict."""
    require_muon()
    batches = copy_batches(args.steps, args.batch, args.seq, args.vocab, args.seed)
    start = time.perf_counter()
    runs = {"muon": train(args, False, batches), "muonclip": train(args, True, batches)}
    elapsed = time.perf_counter() - start
    args.out.mkdir(parents=True, exist_ok=True)
    png = args.out / "max_logit_vs_step.png"
    plot(runs["muon"], runs["muonclip"], args.tau, png)
    (args.out / "history.json").write_text(json.dumps(runs))
    print(f"\n{'run':<10} {'peak max logit':>15} {'final loss':>11} {'mean loss last 20':>18} {'steps clipped':>14}")
    for name, hist in runs.items():
        clipped = sum(1 for n in hist["num_clipped"] if n)
        print(
            f"{name:<10} {max(hist['max_logit']):>15.2f} {hist['loss'][-1]:>11.4f} "
            f"{statistics.mean(hist['loss'][-20:]):>18.4f} {clipped:>14d}"
        )
    print(
        f"tau = {args.tau:g}, {args.steps} steps, lr {args.lr:g}, wd {args.weight_decay:g}, "
        f"model {args.model}, {elapsed:.0f} s total; plot: {png}"
    )
    return {
        "muon_peak_logit": round(max(runs["muon"]["max_logit"]), 3),
        "muonclip_peak_logit": round(max(runs["muonclip"]["max_logit"]), 3),
        "tau": args.tau,
        "muon_final_loss": round(runs["muon"]["loss"][-1], 4),
        "muonclip_final_loss": round(runs["muonclip"]["loss"][-1], 4),
        "muon_mean_loss_last20": round(statistics.mean(runs["muon"]["loss"][-20:]), 4),
        "muonclip_mean_loss_last20": round(statistics.mean(runs["muonclip"]["loss"][-20:]), 4),
        "muonclip_steps_with_clipping": sum(1 for n in runs["muonclip"]["num_clipped"] if n),
        "steps": args.steps,
        "lr": args.lr,
        "model": args.model,
        "png": str(png),
    }


def _time_pair(model: PreTrainedModel, fn, repeats: int) -> tuple[list[float], list[float]]:
    """Wall times of `fn()` with plain attention and with the recorder, interleaved run by run
    (the machine is shared, so interleaving keeps both exposed to the same load)."""
    plain, recorded = [], []
    fn()
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        plain.append(time.perf_counter() - start)
        with MaxLogitRecorder().attach(model):
            start = time.perf_counter()
            fn()
            recorded.append(time.perf_counter() - start)
    return plain, recorded


@torch.no_grad()
def _fwd(model: PreTrainedModel, ids: torch.Tensor) -> None:
    model(input_ids=ids)


def _fwd_bwd(model: PreTrainedModel, ids: torch.Tensor) -> None:
    model.zero_grad(set_to_none=True)
    model(input_ids=ids, labels=ids).loss.backward()


def measure_cost(args: argparse.Namespace, repeats: int = 11) -> dict:
    """fwd / fwd+bwd time with plain sdpa vs the recording attention, batch 8 x 256 (min and median)."""
    rows, result = [], {}
    for flavor in ("tiny-qwen2", "tiny-k2"):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(flavor_config(flavor, 4096), dtype=torch.float32)
        ids = torch.randint(1, 4096, (8, 256), generator=torch.Generator().manual_seed(0))
        for mode, fn in (("fwd", lambda: _fwd(model, ids)), ("fwd+bwd", lambda: _fwd_bwd(model, ids))):
            plain, recorded = _time_pair(model, fn, repeats)
            best = 100 * (min(recorded) / min(plain) - 1)
            med = 100 * (statistics.median(recorded) / statistics.median(plain) - 1)
            rows.append((flavor, mode, min(plain), min(recorded), best, med))
            result[f"{flavor}/{mode}/overhead_pct_min"] = round(best, 1)
            result[f"{flavor}/{mode}/overhead_pct_median"] = round(med, 1)
    for flavor, (heads, kv_heads, dim) in {"tiny-qwen2": (4, 2, 64), "tiny-k2": (4, 4, 128)}.items():
        q, k = torch.randn(8, heads, 256, dim), torch.randn(8, kv_heads, 256, dim)
        per_call = min(_times(lambda: per_head_max_logit(q, k, None, dim**-0.5, True), repeats))
        result[f"{flavor}/recorder_ms_per_layer"] = round(1e3 * per_call, 2)
    print(
        f"{'model':<11} {'pass':<8} {'sdpa ms (min)':>14} {'recording ms (min)':>19} "
        f"{'overhead min':>13} {'overhead median':>16}"
    )
    for flavor, mode, plain, recorded, best, med in rows:
        print(f"{flavor:<11} {mode:<8} {1e3 * plain:>14.1f} {1e3 * recorded:>19.1f} {best:>12.1f}% {med:>15.1f}%")
    for flavor in ("tiny-qwen2", "tiny-k2"):
        print(f"{flavor}: recorder alone {result[f'{flavor}/recorder_ms_per_layer']:.2f} ms per layer call (x4 layers)")
    return result


def _times(fn, repeats: int) -> list[float]:
    """Wall times of `fn()` over `repeats` runs after one warm-up."""
    return wall_times(fn, repeats)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    summary = measure_cost(args) if args.cost else stress(args)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
