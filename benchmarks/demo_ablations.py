"""Benchmark: what budget control, the PTX loss and temperature decay each do to the demo, over seeds.

Run: `python benchmarks/demo_ablations.py [--seeds 0 1 2] [--out runs/demo_ablations]` (repo root).
Per seed, the full recipe runs once (`k2post recipe configs/recipe_demo.yaml seed=S`, shared with
benchmarks/demo_seeds.py when `--out` is the same); each variant then reuses that seed's model, data, SFT
model and before-RL evals (links) and reruns only RL + the after-RL evals with one part switched off:

    full            configs/rl_demo.yaml as it is
    no_budget       budget.penalty=none          (a truncated response keeps its reward)
    no_ptx          loss.ptx_coef=0
    with_ptx        loss.ptx_coef=0.1 on the seed's SFT data (2 rows a step, every domain)
    no_temp_decay   temperature.default.kind=constant (the start temperature throughout)
    tight_budget    budget.default_max_tokens=TIGHT_BUDGET (reasoning_gym and math; tool_use keeps 256): the
                    demo's 32 never binds (truncation 0), this budget does, so it shows what the penalty does

A variant that changes a token budget gets its own before-RL evals (the SFT model under that budget); the others
reuse the seed's.

A variant whose overrides leave the RL config as it is is not rerun: it reports `full`'s runs and is marked
"= full" in the table and `"same_as_full": true` in the JSON. (Up to 8d3f3e9 the demo ran without PTX, so `no_ptx`
was `full`; since 2026-12-05 it runs PTX on math rows, so `no_ptx` is a real variant and `with_ptx` swaps in every
domain's rows at 0.1.)

Prints, per variant, the test-split gain over the RL environments, the mean response length and the
truncation rate after RL (mean +- std over seeds), then one JSON line {"variants": {name: {...}}, "seeds": [..]}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from demo_seeds import mean_gain, mean_std, run_seed  # noqa: E402

# Between the median and the 90th percentile of the SFT answers' lengths (seed 0's synth data: math 12/14 tokens,
# reasoning_gym 14/17; docs/LOG.md), so it binds on part of the responses; chosen from training data, not evals.
TIGHT_BUDGET = 16
VARIANTS: dict[str, list[str]] = {
    "full": [],
    "no_budget": ["budget.penalty=none"],
    "no_ptx": ["loss.ptx_coef=0"],
    "no_temp_decay": ["temperature.default.kind=constant"],
    "with_ptx": [
        "loss.ptx_coef=0.1",
        "loss.ptx_rows_per_step=2",
        "loss.ptx_domains=[]",
        "loss.ptx_data={run_dir}/synth/dataset",
    ],
    "tight_budget": [f"budget.default_max_tokens={TIGHT_BUDGET}"],
}
SHARED = ("model", "synth", "sft")  # reused by every variant of a seed


def same_as_full(config: str, name: str) -> bool:
    """Whether the variant's overrides leave the recipe's RL config unchanged (then its runs would be full's)."""
    from k2post.config.registry import load_run_config

    rl = ROOT / load_run_config(str(ROOT / config), [], expected_kind="recipe").rl
    full = load_run_config(str(rl), [], expected_kind="rl").model_dump()
    return load_run_config(str(rl), overrides_of(name, Path("run")), expected_kind="rl").model_dump() == full


def overrides_of(name: str, run_dir: Path) -> list[str]:
    """The variant's RL overrides, with `{run_dir}` (the variant's run dir) filled in."""
    return [override.format(run_dir=run_dir) for override in VARIANTS[name]]


def changes_budget(name: str) -> bool:
    """Whether the variant sets a token budget (then the SFT model is evaluated again under it)."""
    return any(o.startswith(("budget.default_max_tokens=", "budget.max_tokens")) for o in VARIANTS[name])


def run_variant(config: str, seed: int, out: Path, name: str) -> dict[str, Any]:
    """RL + after-RL evals of one variant, on the seed's shared SFT model; returns its report."""
    base, run_dir = out / f"seed{seed}", out / f"seed{seed}-{name}"
    if name == "full" or same_as_full(config, name):
        return json.loads((base / "report.json").read_text())
    report = run_dir / "report.json"
    if not report.is_file():
        (run_dir / "eval").mkdir(parents=True, exist_ok=True)
        for part in SHARED:
            if not (run_dir / part).exists():
                (run_dir / part).symlink_to((base / part).resolve(), target_is_directory=True)
        if not changes_budget(name):
            for before in (base / "eval").glob("before_rl*.json"):
                (run_dir / "eval" / before.name).write_text(before.read_text())
        rl = ",".join(overrides_of(name, run_dir))
        cmd = [
            sys.executable,
            "-m",
            "k2post_pipelines.recipe",
            config,
            f"seed={seed}",
            f"run_dir={run_dir}",
            f"model.path={run_dir / 'model'}",
            f"rl_overrides=[{rl}]",
        ]
        if subprocess.run(cmd, cwd=ROOT).returncode != 0:
            raise SystemExit(f"demo_ablations: {name} seed {seed} failed; logs in {run_dir / 'logs'}")
    return json.loads(report.read_text())


def after_stat(report: dict[str, Any], key: str) -> float:
    """Mean over the RL environments of an after-RL eval statistic (test split)."""
    return statistics.fmean(pair["after"][key] for pair in report["envs"].values())


def summarize(reports: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Per variant: gain mean/std, response tokens and truncation after RL (means over seeds)."""
    out = {}
    for name, per_seed in reports.items():
        gain_mean, gain_std = mean_std([mean_gain(r, "envs") for r in per_seed])
        out[name] = {
            "gain_mean": gain_mean,
            "gain_std": gain_std,
            "shifted_gain_mean": statistics.fmean(mean_gain(r, "shifted") or 0.0 for r in per_seed),
            "response_tokens_after": statistics.fmean(after_stat(r, "response_tokens_mean") for r in per_seed),
            "truncation_after": statistics.fmean(after_stat(r, "truncation_rate") for r in per_seed),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--config", default="configs/recipe_demo.yaml")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "demo_seeds")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    args = parser.parse_args(argv)
    for seed in args.seeds:
        run_seed(args.config, seed, args.out, [])
    reports = {name: [run_variant(args.config, s, args.out, name) for s in args.seeds] for name in args.variants}
    figures = summarize(reports)
    for name in figures:
        figures[name]["same_as_full"] = name != "full" and same_as_full(args.config, name)
    print(
        f"{'variant':<15} {'test gain (mean +- std)':>24} {'shifted gain':>13} {'resp. tokens':>13} {'truncated':>10}"
    )
    for name, row in figures.items():
        label = f"{name} (= full)" if row["same_as_full"] else name
        print(
            f"{label:<15} {row['gain_mean']:>+14.3f} +- {row['gain_std']:.3f} {row['shifted_gain_mean']:>+13.3f} "
            f"{row['response_tokens_after']:>13.1f} {row['truncation_after']:>10.3f}"
        )
    print(json.dumps({"seeds": args.seeds, "variants": figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
