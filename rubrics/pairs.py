"""On-policy calibration pairs from a model: sample K answers per verifiable prompt, keep (correct, wrong) pairs.

    k2post critic pairs runs/demo/sft/final --env math --env-config configs/rl_critic.yaml --split test --n 64 --k 8 \\
        --out runs/critic/heldout_pairs.jsonl

The model answers each task K times (vLLM in this process, temperature `--temperature`); the
environment's verifier scores the answers in isolated workers; every task with mixed results
gives up to `--pairs-per-task` pairs (`rubrics.calibration.pairs_from_group`). The file is what
`critic_calibration`'s `heldout_pairs_path` / `train_pairs_path` read: held-out pairs from the
test split are how the critic's agreement with the verifier is measured before and after RL.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from typing import Any

from rubrics.calibration import CalibrationPair, pairs_from_group


def sampled_groups(cfg: Any) -> list[tuple[str, Any, list[str], list[float]]]:
    """(env name, task, K answers, K rewards) per task: `cfg` is an EvalConfig with samples_per_task = K."""
    from k2post.envs.workers import RewardPool
    from k2post.evaluation.heldout import draw_tasks, eval_work, run_episodes, score_items
    from k2post.evaluation.heldout import final_text

    envs = {entry.name: entry.make() for entry in cfg.envs}
    tasks = {name: draw_tasks(env, cfg.split, cfg.n, cfg.seed) for name, env in envs.items()}
    episodes = run_episodes(cfg, eval_work(tasks, cfg.budget, cfg.temperature, cfg.samples_per_task, cfg.seed))
    with RewardPool(num_workers=cfg.reward_workers, timeout_s=cfg.reward_timeout_s) as pool:
        rewards = pool.score_batch(score_items(episodes, envs, cfg.env_configs()))
    groups: dict[tuple[str, str], list[tuple[str, float]]] = defaultdict(list)
    for episode, reward in zip(episodes, rewards):
        groups[(episode.env_name, episode.task.id)].append((final_text(episode), reward.value))
    by_id = {(name, t.id): t for name, ts in tasks.items() for t in ts}
    return [(name, by_id[(name, tid)], [a for a, _ in rows], [v for _, v in rows]) for (name, tid), rows in groups.items()]


def build_pairs(cfg: Any, pairs_per_task: int) -> list[CalibrationPair]:
    """Every mixed group's pairs, in task order."""
    return [pair for name, task, answers, rewards in sampled_groups(cfg)
            for pair in pairs_from_group(name, task, answers, rewards, cfg.success_threshold, pairs_per_task, cfg.seed)]


def cmd_pairs(args: argparse.Namespace) -> int:
    """`k2post critic pairs`: sample, verify, write the pairs file, print counts."""
    from environments.critic_calibration import write_pairs
    from k2post.evaluation.cli import build_eval_config

    eval_args = argparse.Namespace(**{**vars(args), "samples": args.k, "out": "-"})  # the eval flags, K samples each
    cfg = build_eval_config(eval_args).model_copy(update={"report_path": None})
    pairs = build_pairs(cfg, args.pairs_per_task)
    write_pairs(args.out, pairs)
    print(f"critic pairs: {len(pairs)} pairs from {cfg.n} {cfg.split} tasks per env x {cfg.samples_per_task} samples -> {args.out}")
    return 0


def add_critic_parser(sub: argparse._SubParsersAction) -> None:
    critic = sub.add_parser("critic", help="the self-critique critic's tools").add_subparsers(dest="critic_cmd", required=True)
    pairs = critic.add_parser("pairs", help="on-policy (correct, wrong) answer pairs of a model on verifiable tasks (JSONL)")
    pairs.add_argument("target", metavar="MODEL_OR_RUN_DIR", help="HF model dir, or a run dir (its final/ or newest checkpoint)")
    pairs.add_argument("--env", action="append", metavar="NAME", help="verifiable environment (repeatable; default: the run's envs)")
    pairs.add_argument("--env-config", action="append", metavar="YAML", help="env config, or a run config with an `envs:` list")
    pairs.add_argument("--split", choices=("test", "dev", "train"), default="test", help="task split (default test: held-out pairs; dev: pairs for dev_pairs_path)")
    pairs.add_argument("--n", type=int, default=64, help="tasks per environment (default 64)")
    pairs.add_argument("--k", type=int, default=8, help="answers sampled per task (default 8)")
    pairs.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1.0)")
    pairs.add_argument("--pairs-per-task", type=int, default=2, help="most pairs per task (default 2)")
    pairs.add_argument("--seed", type=int, default=0, help="seed of the task draw and the sampling (default 0)")
    pairs.add_argument("--max-tokens", type=int, default=None, help="answer budget (default: the run's budgets, else 256)")
    pairs.add_argument("--out", required=True, help="the pairs file (JSONL)")
    pairs.set_defaults(func=cmd_pairs)
