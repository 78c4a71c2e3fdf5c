"""`k2post judge train CONFIG`: fine-tune a small model into a sentence-level faithfulness judge; `k2post judge eval
JUDGE_DIR`: its held-out accuracy per perturbation kind beside the lexical fallback's.

    k2post judge train configs/judge_faithfulness.yaml out_dir=runs/judge       # -> runs/judge/model (+ judge.json)
    k2post judge eval runs/judge --entities 100 --pairs 1200 --seed 7              # test pairs of unseen entities
    python -m k2post_pipelines.judge train CONFIG                                 # the same

The trained judge is what the faithfulness gym uses with `judge: trained, judge_model: runs/judge` and what
`k2post rephrase` uses with `fidelity_judge: model, judge_model: runs/judge` (docs/REPHRASE.md). A bad config or
path is one line `k2post judge: error: ...` and exit status 2; so is `eval --entities` outside [3, 10,000] or
`--pairs` outside [2, 50,000] (before anything is built).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from k2post.command import add_config_arguments, check_range, command_parser, run_command

TEST_CORPUS_SEED = 1000  # test entities: a corpus seed no config trains or selects on
# `judge eval` bounds: 10,000 entities build in ~4 s, 50,000 pairs are ~40x the default's judge calls; past them a
# typo (--entities 1000000000) would run for hours, so it is refused (one line)
MAX_TEST_ENTITIES, MAX_TEST_PAIRS = 10_000, 50_000


def _progress(cfg: Any):
    """A rich progress bar over the training steps (a plain line per eval when stderr is not a terminal)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    columns = (TextColumn("judge train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[note]}"))
    progress = Progress(*columns, TimeElapsedColumn(), console=console, disable=not cfg.progress_bar)
    return console, progress


def _train(args: argparse.Namespace) -> int:
    from k2post.config.registry import load_run_config
    from k2post.judging.faithfulness_model import train_judge

    cfg = load_run_config(args.file, args.overrides, expected_kind="judge")
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    console, progress = _progress(cfg)
    with progress, open(out / "metrics.jsonl", "w") as metrics:
        task = progress.add_task("train", total=cfg.train.lm_steps + cfg.train.steps, note="")

        def log(record: dict[str, Any]) -> None:
            metrics.write(json.dumps(record) + "\n")
            if "lm_step" in record:
                progress.update(task, advance=1, note=f"LM loss {record['lm_loss']:.3f}")
                return
            note = f"loss {record['loss']:.3f}"
            if "dev_acc" in record:
                note += f" dev acc {record['dev_acc']:.3f}"
                if not cfg.progress_bar:
                    console.print(f"judge train: step {record['step']}/{cfg.train.steps} {note}")
            progress.update(task, advance=1, note=note)

        summary = train_judge(cfg, log)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"judge train: dev accuracy {summary['dev_acc']:.3f} at step {summary['best_step']} "
        f"(threshold {summary['threshold']}) -> {out / 'model'}"
    )
    return 0


def held_out_report(judge_path: str, entities: int, pairs: int, seed: int) -> dict[str, Any]:
    """Accuracy of the trained judge and of the lexical fallback on the same test pairs, overall and per kind."""
    from k2post_environments.faithfulness import LexicalOverlapJudgeFallback
    from k2post.judging.faithfulness_model import accuracy, evaluate_pairs, load_trained_judge
    from k2post.judging.faithfulness_pairs import KINDS, make_pairs
    from k2post.rephrase.corpus import build_corpus

    test = make_pairs(build_corpus(entities, TEST_CORPUS_SEED + seed), pairs, TEST_CORPUS_SEED + seed)
    judged = evaluate_pairs(load_trained_judge(judge_path), test)
    lexical = LexicalOverlapJudgeFallback()
    hits = [float(bool(lexical.judge(p.source, p.sentence).supported)) for p in test]
    report: dict[str, Any] = {"pairs": len(test), "judge_acc": judged["acc"]}
    report["lexical_acc"] = accuracy(hits, [p.supported for p in test], 0.5)
    for kind in KINDS:
        chosen = [(hit, p.supported) for hit, p in zip(hits, test) if p.kind == kind]
        report[f"judge_acc/{kind}"] = judged.get(f"acc/{kind}")
        report[f"lexical_acc/{kind}"] = accuracy(*zip(*chosen), 0.5) if chosen else None
    return report


def _eval(args: argparse.Namespace) -> int:
    check_range("--entities", args.entities, 3, MAX_TEST_ENTITIES)
    check_range("--pairs", args.pairs, 2, MAX_TEST_PAIRS)
    report = held_out_report(args.judge, args.entities, args.pairs, args.seed)
    print(f"{'kind':<22}{'trained':>9}{'lexical':>9}")
    for key in [k for k in report if k.startswith("judge_acc/")]:
        kind = key.split("/", 1)[1]
        print(f"{kind:<22}{report[key]:>9.3f}{report['lexical_acc/' + kind]:>9.3f}")
    print(f"{'all':<22}{report['judge_acc']:>9.3f}{report['lexical_acc']:>9.3f}   ({report['pairs']} pairs)")
    print(json.dumps(report))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("judge", "the sentence-level faithfulness judge: train, evaluate")
    sub = parser.add_subparsers(dest="judge_cmd", required=True)
    train = sub.add_parser("train", help="fine-tune a small model on synthetic (source, sentence) pairs")
    add_config_arguments(train, "judge", "configs/judge_faithfulness.yaml")
    train.set_defaults(func=_train)
    evaluate = sub.add_parser("eval", help="held-out accuracy per perturbation kind, beside the lexical fallback")
    evaluate.add_argument("judge", help="a `judge train` out_dir (or its model/ dir)")
    evaluate.add_argument("--entities", type=int, default=100, help="entities of the test corpus (default 100)")
    evaluate.add_argument("--pairs", type=int, default=1200, help="test pairs (default 1200, half supported)")
    evaluate.add_argument("--seed", type=int, default=0, help="test corpus seed offset (default 0)")
    evaluate.set_defaults(func=_eval)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv, lambda args: args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
