"""`k2post critic pairs`: on-policy (correct, wrong) answer pairs of a model on verifiable tasks, as JSONL.

    k2post critic pairs runs/demo/sft/final --env math --env-config configs/rl_critic.yaml --split test --n 64 --k 8 \\
        --out runs/critic/heldout_pairs.jsonl
    python -m k2post_pipelines.critic pairs MODEL_OR_RUN_DIR --env math --out pairs.jsonl    # the same

The model answers each task `--k` times (vLLM in this process, `--temperature`); the verifier scores
them in isolated workers; every task with mixed results gives up to `--pairs-per-task` pairs (the
sampling and pairing: rubrics/pairs.py). The target and env flags resolve as `k2post eval`'s do. A bad
flag, file or env is one line `k2post critic: error: ...` and exit status 2.
"""

from __future__ import annotations

import argparse

from k2post.command import command_parser, run_command
from k2post_pipelines.eval import add_target_arguments, request_from_args


def _pairs(args: argparse.Namespace) -> int:
    """Sample, verify, write the pairs file, print counts."""
    from k2post_environments.critic_calibration import write_pairs
    from k2post.evaluation.request import build_eval_config
    from k2post_rubrics.pairs import build_pairs

    request = request_from_args(args, samples=args.k, out="-")  # the eval flags, K samples each, no report
    cfg = build_eval_config(request).model_copy(update={"report_path": None})
    pairs = build_pairs(cfg, args.pairs_per_task)
    write_pairs(args.out, pairs)
    print(
        f"critic pairs: {len(pairs)} pairs from {cfg.n} {cfg.split} tasks per env x {cfg.samples_per_task} samples "
        f"-> {args.out}"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("critic", "the self-critique critic's tools")
    sub = parser.add_subparsers(dest="critic_cmd", required=True)
    pairs = sub.add_parser("pairs", help="on-policy (correct, wrong) answer pairs of a model on verifiable tasks")
    add_target_arguments(pairs, "verifiable environment (repeatable; default: the run's envs)")
    pairs.add_argument(
        "--split",
        choices=("test", "dev", "train"),
        default="test",
        help="task split (default test: held-out pairs; dev: pairs for dev_pairs_path)",
    )
    pairs.add_argument("--k", type=int, default=8, help="answers sampled per task (default 8)")
    pairs.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1.0)")
    pairs.add_argument("--pairs-per-task", type=int, default=2, help="most pairs per task (default 2)")
    pairs.add_argument("--out", required=True, help="the pairs file (JSONL)")
    pairs.set_defaults(func=_pairs)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv, lambda args: args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
