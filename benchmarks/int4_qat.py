"""Benchmark: is a policy trained with INT4 QAT served in INT4 without loss? bf16 vs PTQ vs QAT on tiny-k2.

Run: `python benchmarks/int4_qat.py [--seeds 0 1 2] [--out runs/int4_qat] [RECIPE OVERRIDES...]` (repo root).
Per seed, on the K2-shaped model (tiny-k2: MLA, routed + shared experts):

1. `plain`: the demo recipe (`configs/recipe_demo.yaml`: model -> synth -> SFT -> eval -> RL -> eval), no QAT;
2. `qat`: the same run from the same SFT checkpoint (its model, data and SFT stages copied, so skipped), with
   `qat.enabled=true` in RL: the trainer's forward fake-quantizes the routed experts and the rollout engine is
   pushed their INT4 round trip;
3. each final policy exported with `k2post.quant.export_int4` (compressed-tensors pack-quantized, what K2 Thinking
   ships) and unpacked back to a dense model dir (`dense_from_int4`): what an INT4 server computes with;
4. the held-out eval (test split, the recipe's tasks) of: the plain policy unquantized (`bf16_acc`), its INT4
   round trip (round-to-nearest PTQ, `ptq_int4_acc`), the QAT policy's INT4 round trip (`qat_int4_acc`).

All three are served by the same engine in float32 (this box's serving dtype; the INT4 values are exact in it),
so the only difference between them is the quantization. `expert_bytes_ratio`: bytes of the routed experts in
INT4 (packed nibbles + one bf16 scale per group of 32) over bf16. A finished step is reused (delete its folder
to redo it). Prints per seed and the mean +- std, then one JSON line:
{"seeds": [..], "bf16_acc": .., "ptq_int4_acc": .., "qat_int4_acc": .., "bf16_acc_std": .., "ptq_int4_acc_std": ..,
 "qat_int4_acc_std": .., "expert_bytes_ratio": .., "minutes_per_seed": ..}
(minutes: the two recipe runs' wall time, from their reports).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHARED_STAGES = ("model", "synth", "sft", "eval", "rl_config.yaml")  # what the QAT arm takes from the plain run
GROUP = 32


def recipe(config: str, run_dir: Path, seed: int, overrides: list[str]) -> dict[str, Any]:
    """One recipe run on tiny-k2 (skipped when its report exists); its report.json."""
    report = run_dir / "report.json"
    if not report.is_file():
        cmd = [sys.executable, "-m", "k2post_pipelines.recipe", config, f"seed={seed}", f"run_dir={run_dir}"]
        done = subprocess.run([*cmd, "model.flavor=tiny-k2", *overrides], cwd=ROOT)
        if done.returncode != 0:
            raise SystemExit(f"int4_qat: recipe failed in {run_dir} (exit {done.returncode}); logs in {run_dir}/logs")
    return json.loads(report.read_text())


def branch_from(plain: Path, qat: Path) -> None:
    """The QAT arm starts from the plain run's model, data and SFT checkpoint (and its before-RL eval)."""
    qat.mkdir(parents=True, exist_ok=True)
    for name in SHARED_STAGES:
        source, target = plain / name, qat / name
        if target.exists() or not source.exists():
            continue
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("after_rl*"))
        else:
            shutil.copy2(source, target)


def int4_served(model_dir: Path, out: Path) -> tuple[Path, int]:
    """`model_dir`'s routed experts through the INT4 export and back: a dense model dir holding exactly what an
    INT4 server computes with; and the number of quantized weights."""
    served = out / "served"
    if (served / "config.json").is_file():
        return served, json.loads((out / "quantized.json").read_text())["weights"]
    from safetensors.torch import save_file

    from k2post.quant.config import QATConfig
    from k2post.quant.export import WEIGHTS, dense_from_int4, export_int4

    report = export_int4(model_dir, out / "export", QATConfig(enabled=True, group_size=GROUP), overwrite=True)
    tensors = dense_from_int4(out / "export")
    shutil.copytree(out / "export", served, ignore=shutil.ignore_patterns(WEIGHTS, "config.json"))
    shutil.copy2(model_dir / "config.json", served / "config.json")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(served / WEIGHTS), metadata={"format": "pt"})
    weights = quantized_weight_count(out / "export" / WEIGHTS)
    (out / "quantized.json").write_text(json.dumps({"weights": weights, "tensors": report.quantized}) + "\n")
    return served, weights


def quantized_weight_count(weights_file: Path) -> int:
    """Weights held in INT4 by an export (the product of every `*.weight_shape`)."""
    from safetensors import safe_open

    total = 0
    with safe_open(str(weights_file), framework="pt") as handle:
        for name in handle.keys():
            if name.endswith(".weight_shape"):
                rows, cols = handle.get_tensor(name).tolist()
                total += rows * cols
    return total


def evaluate(model_dir: Path, run_dir: Path, report: dict[str, Any], out: Path) -> float:
    """The recipe's held-out eval (same envs, tasks and budgets) of another model dir; its mean accuracy."""
    if not out.is_file():
        envs = [flag for name in report["envs"] for flag in ("--env", name)]
        cmd = [sys.executable, "-m", "k2post_pipelines.eval", str(model_dir), *envs]
        cmd += ["--env-config", str(run_dir / "rl_config.yaml"), "--n", str(report["eval_n"])]
        cmd += ["--seed", str(report["eval_seed"]), "--out", str(out)]
        done = subprocess.run(cmd, cwd=ROOT)
        if done.returncode != 0:
            raise SystemExit(f"int4_qat: eval of {model_dir} failed (exit {done.returncode})")
    return float(json.loads(out.read_text())["mean_accuracy"])


def expert_bytes_ratio(weights: int, group: int = GROUP) -> float:
    """INT4 bytes (half a byte a weight + a bf16 scale per group) over bf16 bytes (two a weight)."""
    return (weights / 2 + 2 * weights / group) / (2 * weights) if weights else float("nan")


def run_seed(config: str, seed: int, out: Path, overrides: list[str]) -> dict[str, Any]:
    """The three accuracies of one seed (and the quantized weight count)."""
    plain_dir, qat_dir = out / f"seed{seed}" / "plain", out / f"seed{seed}" / "qat"
    plain = recipe(config, plain_dir, seed, overrides)
    branch_from(plain_dir, qat_dir)
    qat_overrides = [*overrides, *qat_rl_overrides(overrides)]
    qat = recipe(config, qat_dir, seed, qat_overrides)
    ptq_model, weights = int4_served(plain_dir / "rl" / "final", out / f"seed{seed}" / "ptq_int4")
    qat_model, _ = int4_served(qat_dir / "rl" / "final", out / f"seed{seed}" / "qat_int4")
    eval_dir = out / f"seed{seed}" / "eval"
    return {
        "seed": seed,
        "bf16_acc": float(plain["mean_accuracy_after"]),
        "ptq_int4_acc": evaluate(ptq_model, plain_dir, plain, eval_dir / "ptq_int4.json"),
        "qat_int4_acc": evaluate(qat_model, qat_dir, plain, eval_dir / "qat_int4.json"),
        "weights": weights,
        "minutes": (plain["wall_s"] + qat["wall_s"]) / 60,  # both recipe runs (the QAT one: its RL and eval)
    }


def qat_rl_overrides(overrides: list[str]) -> list[str]:
    """The recipe's `rl_overrides` with QAT on (added to any the caller gave)."""
    given = next((o.partition("=")[2] for o in overrides if o.startswith("rl_overrides=")), "[]")
    items = [item.strip() for item in given.strip("[]").split(",") if item.strip()]
    return [f"rl_overrides=[{', '.join([*items, 'qat.enabled=true'])}]"]


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and std over seeds of each accuracy; the expert bytes ratio (pure: tested on hand-made rows)."""
    out: dict[str, Any] = {"seeds": [r["seed"] for r in rows]}
    for key in ("bf16_acc", "ptq_int4_acc", "qat_int4_acc"):
        values = [r[key] for r in rows]
        out[key] = statistics.fmean(values)
        out[f"{key}_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
    out["expert_bytes_ratio"] = expert_bytes_ratio(rows[0]["weights"])
    out["minutes_per_seed"] = statistics.fmean(r["minutes"] for r in rows)
    return out


def print_table(rows: list[dict[str, Any]], figures: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="tiny-k2 after the demo's RL: held-out mean accuracy (test split)")
    for column in ("seed", "bf16 (unquantized)", "PTQ INT4", "QAT INT4"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(str(r["seed"]), f"{r['bf16_acc']:.3f}", f"{r['ptq_int4_acc']:.3f}", f"{r['qat_int4_acc']:.3f}")
    cells = [f"{figures[k]:.3f} +- {figures[k + '_std']:.3f}" for k in ("bf16_acc", "ptq_int4_acc", "qat_int4_acc")]
    table.add_row("mean +- std", *cells)
    Console(width=120).print(table)
    print(f"routed-expert bytes INT4 / bf16: {figures['expert_bytes_ratio']:.4f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--config", default="configs/recipe_demo.yaml")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "int4_qat")
    parser.add_argument("overrides", nargs="*", help="extra key.path=value overrides of the recipe config")
    args = parser.parse_args(argv)
    rows = [run_seed(args.config, seed, args.out, args.overrides) for seed in args.seeds]
    figures = summarize(rows)
    print_table(rows, figures)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
