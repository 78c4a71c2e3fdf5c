"""Benchmark: the trained sentence-level faithfulness judge vs the lexical-overlap fallback, on held-out pairs.

Run: `python benchmarks/faithfulness_judge.py [--seeds 0 1 2] [--out runs/faithfulness_judge] [--smoke]
[key.path=value ...]` (repo root; the overrides go to every `judge train`, e.g. `train.threads=1` beside other work).
Per seed: `k2post judge train configs/judge_faithfulness.yaml seed=S` (train pairs from one corpus of invented
entities, dev pairs from another: the step and the threshold are picked on dev), then both judges label the same
test pairs, drawn from a third corpus no setting saw (`k2post judge eval`: every perturbation kind; half the pairs
are supported). Prints accuracy per kind and per seed, the mean +- std over seeds, then one JSON line:
{"judge_acc": .., "judge_acc_std": .., "lexical_acc": .., "pairs": .., "seeds": [..], "per_kind": {..},
 "train_minutes": ..}
(`lexical_acc` is deterministic: one test set per seed, so its std is over the test sets). A finished seed is
reused (delete its folder to redo it). `--smoke`: a few steps on a few pairs (checks the script, not the figure).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SMOKE = ["data.train_entities=20", "data.train_pairs=100", "data.dev_entities=10", "data.dev_pairs=40",
         "train.steps=6", "train.batch_size=8", "train.warmup_steps=2", "train.eval_every=3", "train.lm_steps=3",
         "train.lm_wordings=2"]  # fmt: skip


def train(seed: int, out: Path, extra: list[str]) -> float:
    """Train (or reuse) the seed's judge; minutes it took (0 when reused)."""
    from k2post_pipelines.judge import main

    if (out / "model" / "judge.json").is_file():
        return 0.0
    started = time.monotonic()
    overrides = [f"out_dir={out}", f"model.path={out / 'base'}", f"model.seed={seed}", f"seed={seed}"]
    if main(["train", "configs/judge_faithfulness.yaml", *overrides, "progress_bar=false", *extra]) != 0:
        raise SystemExit(f"faithfulness_judge: training failed for seed {seed} ({out})")
    return (time.monotonic() - started) / 60


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summarize(reports: list[dict[str, Any]], seeds: list[int], minutes: list[float]) -> dict[str, Any]:
    judge, lexical = mean_std([r["judge_acc"] for r in reports]), mean_std([r["lexical_acc"] for r in reports])
    kinds = [key.split("/", 1)[1] for key in reports[0] if key.startswith("judge_acc/")]
    per_kind = {
        kind: {
            "judge": round(statistics.fmean(r[f"judge_acc/{kind}"] for r in reports), 4),
            "lexical": round(statistics.fmean(r[f"lexical_acc/{kind}"] for r in reports), 4),
        }
        for kind in kinds
    }
    return {"judge_acc": round(judge[0], 4), "judge_acc_std": round(judge[1], 4), "lexical_acc": round(lexical[0], 4),
            "lexical_acc_std": round(lexical[1], 4), "pairs": reports[0]["pairs"], "seeds": seeds,
            "per_kind": per_kind, "train_minutes": round(statistics.fmean(minutes), 2)}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="runs/faithfulness_judge")
    parser.add_argument("--pairs", type=int, default=1200, help="test pairs per seed (default 1200)")
    parser.add_argument("--smoke", action="store_true", help="a few steps on a few pairs, one seed")
    parser.add_argument("overrides", nargs="*", default=[], help="key.path=value overrides of judge train")
    args = parser.parse_args()
    from k2post_pipelines.judge import held_out_report

    seeds = args.seeds[:1] if args.smoke else args.seeds
    reports, minutes = [], []
    for seed in seeds:
        out = Path(args.out) / f"seed{seed}"
        minutes.append(train(seed, out, [*(SMOKE if args.smoke else []), *args.overrides]))
        pairs = 60 if args.smoke else args.pairs
        reports.append(held_out_report(str(out), 12 if args.smoke else 100, pairs, seed))
        r = reports[-1]
        print(f"seed {seed}: trained {r['judge_acc']:.3f}  lexical {r['lexical_acc']:.3f}  ({r['pairs']} test pairs)")
    summary = summarize(reports, seeds, minutes)
    print(f"\n{'kind':<22}{'trained':>9}{'lexical':>9}   (mean over {len(seeds)} seeds)")
    for kind, accs in summary["per_kind"].items():
        print(f"{kind:<22}{accs['judge']:>9.3f}{accs['lexical']:>9.3f}")
    print(f"{'all':<22}{summary['judge_acc']:>9.3f}{summary['lexical_acc']:>9.3f}"
          f"   (+- {summary['judge_acc_std']:.3f} / {summary['lexical_acc_std']:.3f})")  # fmt: skip
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
