"""Benchmark: does RL teach, reproducibly? The whole recipe (model -> synth -> SFT -> eval -> RL -> eval) per seed.

Run: `python benchmarks/demo_seeds.py [--seeds 0 1 2] [--config configs/recipe_demo.yaml] [--out runs/demo_seeds]`
(repo root; ~15-20 min a seed on 2 cores). Each seed is `k2post recipe CONFIG seed=S run_dir=OUT/seedS`: the
model's init, the synthesized SFT data, the SFT data order, the RL pools and sampling all follow S. A finished
seed's report is reused (delete its folder to redo it); `--summarize-only` reads existing reports.

Prints per seed and environment the test-split accuracy before and after RL (and the shifted sets'), then the
mean +- std over seeds, and one JSON line:
{"seeds": [..], "gain_mean": .., "gain_std": .., "gain_min": .., "shifted_gain_mean": .., "tool_sft_acc": ..,
 "tool_gain_mean": .., "critic_agreement_before": .., "critic_agreement_after": .., "critic_baseline_best": ..,
 "test_tasks_min": ..,
 "demo_minutes": ..}
`gain_*` is the gain of the mean over the RL environments (test split); `gain_min` the worst seed's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TOOL_ENVS = ("tool_use",)
CRITIC_ENV = "critic_calibration"


def run_seed(config: str, seed: int, out: Path, extra: list[str]) -> dict[str, Any]:
    """The recipe for one seed (skipped when its report exists); returns its report.json."""
    report = out / f"seed{seed}" / "report.json"
    if not report.is_file():
        cmd = [
            sys.executable,
            "-m",
            "k2post_pipelines.recipe",
            config,
            f"seed={seed}",
            f"run_dir={out / f'seed{seed}'}",
            *extra,
        ]
        done = subprocess.run(cmd, cwd=ROOT)
        if done.returncode != 0:
            raise SystemExit(
                f"demo_seeds: seed {seed}: recipe failed (exit {done.returncode}); "
                f"logs in {out / f'seed{seed}' / 'logs'}"
            )
    return json.loads(report.read_text())


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample std (0 for one value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def env_gain(report: dict[str, Any], section: str, name: str) -> float:
    pair = report[section][name]
    return pair["after"]["accuracy"] - pair["before"]["accuracy"]


def mean_gain(report: dict[str, Any], section: str) -> float | None:
    """Gain of the mean accuracy over the section's environments (None if the report has no such section)."""
    rows = report.get(section) or {}
    return statistics.fmean(env_gain(report, section, n) for n in rows) if rows else None


def first_env(report: dict[str, Any], names: tuple[str, ...]) -> str | None:
    return next((n for n in report["envs"] if n in names), None)


def summarize(seeds: list[int], reports: list[dict[str, Any]]) -> dict[str, Any]:
    """The benchmark's figures from the per-seed recipe reports (pure: tested on hand-made reports)."""
    gains = [mean_gain(r, "envs") for r in reports]
    shifted = [g for g in (mean_gain(r, "shifted") for r in reports) if g is not None]
    tool, critic = first_env(reports[0], TOOL_ENVS), CRITIC_ENV if CRITIC_ENV in reports[0]["envs"] else None
    out = {
        "seeds": seeds,
        "gain_mean": mean_std(gains)[0],
        "gain_std": mean_std(gains)[1],
        "gain_min": min(gains),
        "shifted_gain_mean": statistics.fmean(shifted) if shifted else None,
        "tool_sft_acc": None,
        "tool_gain_mean": None,
        "critic_agreement_before": None,
        "critic_agreement_after": None,
        "critic_baseline_best": None,
        "test_tasks_min": min(pair["before"]["n"] for r in reports for pair in r["envs"].values()),
        "demo_minutes": statistics.fmean(r["wall_s"] for r in reports) / 60,
    }
    if tool:
        out["tool_sft_acc"] = statistics.fmean(r["envs"][tool]["before"]["accuracy"] for r in reports)
        out["tool_gain_mean"] = statistics.fmean(env_gain(r, "envs", tool) for r in reports)
    if critic:
        out["critic_agreement_before"] = statistics.fmean(r["envs"][critic]["before"]["accuracy"] for r in reports)
        out["critic_agreement_after"] = statistics.fmean(r["envs"][critic]["after"]["accuracy"] for r in reports)
        out["critic_baseline_best"] = critic_baseline(reports, critic)
    return out


def critic_baseline(reports: list[dict[str, Any]], critic: str) -> float | None:
    """Mean over seeds of the best single-feature judge's agreement on the critic's test pairs (`baseline_best` of the
    eval report: more digits, longer, always A, ...), the figure beside the critic's agreement; None for reports
    written before it was measured."""
    values = [r["envs"][critic]["before"].get("baseline_best") for r in reports]
    return statistics.fmean(values) if values and all(v is not None for v in values) else None


def print_table(seeds: list[int], reports: list[dict[str, Any]], figures: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="test-split accuracy before -> after RL, per seed (shifted sets marked *)")
    table.add_column("env")
    for seed in seeds:
        table.add_column(f"seed {seed}", justify="right")
    table.add_column("gain mean +- std", justify="right")
    for section, mark in (("envs", ""), ("shifted", "*")):
        for name in reports[0].get(section) or {}:
            cells = [
                f"{r[section][name]['before']['accuracy']:.3f} -> {r[section][name]['after']['accuracy']:.3f}"
                for r in reports
            ]
            m, s = mean_std([env_gain(r, section, name) for r in reports])
            table.add_row(f"{name}{mark}", *cells, f"{m:+.3f} +- {s:.3f}")
    m, s = figures["gain_mean"], figures["gain_std"]
    table.add_row("[bold]mean (test)", *[f"{mean_gain(r, 'envs'):+.3f}" for r in reports], f"[bold]{m:+.3f} +- {s:.3f}")
    Console(width=160).print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--config", default="configs/recipe_demo.yaml")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "demo_seeds")
    parser.add_argument("--summarize-only", action="store_true", help="only read the seeds' existing reports")
    parser.add_argument("overrides", nargs="*", help="extra key.path=value overrides of the recipe config")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    if args.summarize_only:
        reports = [json.loads((args.out / f"seed{s}" / "report.json").read_text()) for s in args.seeds]
    else:
        reports = [run_seed(args.config, s, args.out, args.overrides) for s in args.seeds]
    figures = summarize(args.seeds, reports)
    print_table(args.seeds, reports, figures)
    print(f"wall: {(time.perf_counter() - started) / 60:.1f} min")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
