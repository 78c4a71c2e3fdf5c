"""`k2post eval MODEL_OR_RUN_DIR [--env NAME] [--env-config YAML] [--n N] [--seed S] [--split SPLIT]`:
held-out accuracy per environment.

    k2post eval runs/rl_demo --n 100 --seed 3                 # a run dir: its final model, its envs and budgets
    k2post eval artifacts/models/tiny-qwen2 --env math --env-config math.yaml --n 64
    k2post eval runs/sft_demo/final --env reasoning_gym --env-config configs/rl_demo.yaml  # env configs of an RL config
    python -m k2post_pipelines.eval runs/rl_demo --split shifted    # the same without the console script
    k2post eval runs/rl_demo --split test --split shifted --out out/{split}.json   # two splits, one engine build

How the target, env configs, budgets and the report path are resolved: k2post/evaluation/request.py
(docs/EVAL.md). `--split`: test (default: the report), dev (choosing settings), shifted (a held-out
distribution shift), train. Prints a table and where the JSON report went; a bad flag, file or env is
one line `k2post eval: error: ...` and exit status 2.
"""

from __future__ import annotations

import argparse

from k2post.command import command_parser, run_command


def add_target_arguments(parser: argparse.ArgumentParser, env_help: str) -> None:
    """MODEL_OR_RUN_DIR, --env, --env-config, --n, --seed, --max-tokens (shared with `k2post critic pairs`)."""
    parser.add_argument(
        "target", metavar="MODEL_OR_RUN_DIR", help="HF model dir, or a run dir (its final/ or newest checkpoint)"
    )
    parser.add_argument("--env", action="append", metavar="NAME", help=env_help)
    parser.add_argument(
        "--env-config", action="append", metavar="YAML", help="env config, or a run config with an `envs:` list"
    )
    parser.add_argument("--n", type=int, default=64, help="tasks per environment (default 64)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the task draw (default 0)")
    parser.add_argument(
        "--max-tokens", type=int, default=None, help="token budget of every task type (default: the run's, else 256)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("eval", "held-out accuracy per environment of a model or run dir (vLLM, isolated scoring)")
    add_target_arguments(
        parser, "environment to evaluate on (repeatable; default: the run's envs, or those of --env-config)"
    )
    parser.add_argument(
        "--split",
        choices=("test", "dev", "shifted", "train"),
        action="append",
        help="task split: test (default, the report), dev (choosing settings), shifted (generalization), train; "
        "repeatable: several splits share one engine build and each gets its own report",
    )
    parser.add_argument("--samples", type=int, default=1, help="episodes per task; >1 needs --temperature > 0 (avg@k)")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    parser.add_argument(
        "--max-reward-error-fraction",
        type=float,
        default=None,
        metavar="F",
        help="fail when more than this share of a split's rewards are scorer errors (default 0.5; 1: never)",
    )
    parser.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "bfloat16"],
        help="dtype the engine serves the weights in (default float32; bfloat16: as a GPU deployment would)",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="report path (default <run or model dir>/eval/<envs>-n<N>-s<S>.json); with several --split values it "
        "must contain {split}",
    )
    return parser


def request_from_args(args: argparse.Namespace, **changes):
    """The `EvalRequest` of parsed eval (or critic pairs) flags, with `changes` on top."""
    from k2post.evaluation.request import EvalRequest

    flags = {
        "target": args.target,
        "envs": args.env or [],
        "env_configs": args.env_config or [],
        "n": args.n,
        "seed": args.seed,
        "split": args.split if isinstance(args.split, str) else "test",  # eval's repeatable --split: split_requests
        "samples": getattr(args, "samples", 1),
        "temperature": args.temperature,
        "max_tokens": args.max_tokens,
        "out": getattr(args, "out", None),
        "max_reward_error_fraction": getattr(args, "max_reward_error_fraction", None),
        "dtype": getattr(args, "dtype", None),
    }
    return EvalRequest(**{**flags, **changes})


def split_requests(args: argparse.Namespace) -> list:
    """One `EvalRequest` per `--split` (in order, duplicates dropped); `{split}` in --out names each report."""
    from k2post.config.loader import ConfigError

    splits = list(dict.fromkeys(args.split or ["test"]))
    if len(splits) > 1 and args.out is not None and "{split}" not in args.out:
        raise ConfigError(f"--out {args.out!r}: with several --split values ({', '.join(splits)}) put {{split}} in it")
    return [
        request_from_args(args, split=split, out=None if args.out is None else args.out.replace("{split}", split))
        for split in splits
    ]


def run(args: argparse.Namespace) -> int:
    """Run the evaluation (every split on one engine); print the tables and where the reports went. The flags,
    files and env names are checked before torch / vLLM are imported (a mistake is one line in about a second)."""
    from k2post.evaluation.request import build_eval_config

    cfgs = [build_eval_config(request) for request in split_requests(args)]

    from rich.console import Console

    from k2post.evaluation.heldout import check_report_errors, evaluate_splits, report_table

    console = Console(width=120)
    reports = evaluate_splits(cfgs)
    for cfg, report in zip(cfgs, reports):
        console.print(report_table(report))
        for name, texts in report["reward_error_samples"].items():
            console.print(f"[red]reward errors[/] in {name} ({report['envs'][name]['reward_errors']}), first:")
            for text in texts:
                console.print(f"  {text}", markup=False, highlight=False)
        console.print(f"report: {cfg.report_path}")
    for cfg, report in zip(cfgs, reports):
        check_report_errors(report, cfg.max_reward_error_fraction)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv, run)


if __name__ == "__main__":
    raise SystemExit(main())
