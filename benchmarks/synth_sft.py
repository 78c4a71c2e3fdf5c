"""Benchmark: does SFT on synthesized tool-use data teach a random tiny model to call tools on held-out tasks?

Run: `python benchmarks/synth_sft.py [--tasks 400] [--epochs 4] [--heldout 20] [--seed 0] [--out DIR] [--smoke]`
(from the repo root; `--smoke` = 24 tasks, 1 epoch, 2 warmup steps, 4 held-out tasks: the test suite's check that
every step runs and the SFT loss falls; its rates mean nothing).

Steps, all real: `k2post synth` data for the inventory domain (look-up and set-quantity templates, built-in roles,
rubric judge, 10% scripted mistakes the judge must reject) -> the random tiny-qwen2 plays the held-out synthesized
tasks in vLLM (test split, never synthesized) -> SFT with MuonClip under DeepSpeed (configs/sft_tool_use.yaml,
`--epochs` passes) -> the SFT model plays the same held-out tasks. Measured 2026-12-02 on 2 CPU cores (~400 s of
SFT): well-formed call rate 0.00 -> 1.00, solve rate 0.00 -> 0.45 (9 of 20).
Prints a table, then exactly one JSON line:
{"tasks_accepted": .., "heldout": .., "well_formed_before": .., "well_formed_after": .., "solve_before": ..,
 "solve_after": .., "call_rate_before": .., "call_rate_after": .., "eval_loss_start": .., "eval_loss_end": ..,
 "sft_s": .., "total_s": ..}
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TEMPLATES = ["inventory_look_up", "inventory_set_quantity"]
SFT_CONFIG = ROOT / "configs" / "sft_tool_use.yaml"
RATES = {"well_formed_call_rate": "well_formed", "solve_rate": "solve", "call_rate": "call_rate"}
"""`evaluate_tasks` rate -> the name of its figure (`<name>_before`, `<name>_after`)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=400, help="synthesized train tasks (default 400)")
    parser.add_argument("--epochs", type=int, default=4, help="SFT passes over them (default 4)")
    parser.add_argument("--heldout", type=int, default=20, help="held-out tasks played before and after (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="synthesis seed (default 0)")
    parser.add_argument("--out", help="work dir (default: a temp dir, removed at the end)")
    parser.add_argument("--warmup", type=int, default=10, help="SFT lr warmup steps (default 10, the config's)")
    parser.add_argument("--smoke", action="store_true", help="24 tasks, 1 epoch, 4 held-out: checks the steps run")
    args = parser.parse_args(argv)
    if args.smoke:
        args.tasks, args.epochs, args.heldout, args.warmup = 24, 1, 4, 2
    return args


def evaluate(model_dir: Path, tasks: list) -> dict[str, Any]:
    """Greedy episodes of `tasks` in an in-process vLLM engine: well-formed call, call and solve rates."""
    from k2post.rollout.config import VLLMEngineConfig
    from k2post.rollout.vllm_engine import VLLMEngine
    from k2post.synth.evaluate import evaluate_tasks

    engine = VLLMEngine(model_dir, VLLMEngineConfig(dtype="float32", max_model_len=2048, max_num_seqs=32))
    try:
        return evaluate_tasks(engine, tasks)
    finally:
        engine.close()


def synthesize(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    from k2post.synth.config import SynthConfig
    from k2post.synth.pipeline import run_synth

    cfg = SynthConfig(
        out_dir=str(work / "synth"),
        domains=["inventory"],
        templates=TEMPLATES,
        tasks_per_domain=args.tasks,
        heldout_tasks_per_domain=args.heldout,
        mistake_rate=0.1,
        seed=args.seed,
    )
    return run_synth(cfg)


def fine_tune(work: Path, model_dir: Path, epochs: int, warmup: int) -> dict[str, Any]:
    from k2post.config.registry import load_run_config
    from k2post.sft.trainer import run_sft

    overrides = [
        f"run_dir={work / 'sft'}",
        f"model.path={model_dir}",
        f"data.path={work / 'synth' / 'dataset'}",
        f"train.epochs={epochs}",
        f"schedule.warmup_steps={warmup}",
        "train.eval_every=100000",  # eval loss at the start and the end only
        "checkpoint.every=100000",  # the final model only
        "optim.qk_clip.enabled=false",  # QK-Clip has its own tests and benchmark; its S_max pass costs time here
    ]
    return run_sft(load_run_config(SFT_CONFIG, overrides, expected_kind="sft"))


def measure(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    from k2post.models.init import init_model_dir
    from k2post.synth.pipeline import read_heldout

    started = time.perf_counter()
    model_dir = init_model_dir("tiny-qwen2", work / "tiny-qwen2", seed=0)
    synth = synthesize(work, args)
    heldout = read_heldout(work / "synth" / "heldout_tasks.jsonl")
    before = evaluate(model_dir, heldout)
    sft_started = time.perf_counter()
    summary = fine_tune(work, model_dir, args.epochs, args.warmup)
    sft_s = time.perf_counter() - sft_started
    after = evaluate(work / "sft" / "final", heldout)
    figures: dict[str, Any] = {"tasks_accepted": synth["tasks_accepted"], "heldout": len(heldout)}
    for rate, name in RATES.items():
        figures[f"{name}_before"], figures[f"{name}_after"] = before[rate], after[rate]
    figures["eval_loss_start"], figures["eval_loss_end"] = summary["eval_loss_start"], summary["eval_loss_end"]
    figures["sft_s"], figures["total_s"] = round(sft_s, 1), round(time.perf_counter() - started, 1)
    return figures


def table(figures: dict[str, Any]) -> str:
    rows = [
        ("well-formed tool calls", figures["well_formed_before"], figures["well_formed_after"]),
        ("any tool call", figures["call_rate_before"], figures["call_rate_after"]),
        ("solved", figures["solve_before"], figures["solve_after"]),
        ("eval loss", figures["eval_loss_start"], figures["eval_loss_end"]),
    ]
    lines = [f"held-out tasks: {figures['heldout']}, synthesized tasks kept: {figures['tasks_accepted']}", ""]
    lines += ["| held-out | random model | after SFT |", "| --- | --- | --- |"]
    lines += [f"| {name} | {a:.3f} | {b:.3f} |" for name, a, b in rows]
    lines.append(f"\nSFT {figures['sft_s']:.0f} s, all {figures['total_s']:.0f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.out:
        work = Path(args.out)
        work.mkdir(parents=True, exist_ok=True)
        figures = measure(work, args)
    else:
        with tempfile.TemporaryDirectory(prefix="k2post-bench-synth-sft-") as tmp:
            figures = measure(Path(tmp), args)
    print(table(figures))
    print(json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
