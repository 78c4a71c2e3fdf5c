"""Held-out evaluation: episodes on fresh held-out tasks, scored in isolated workers, accuracy per environment.

    report = evaluate(EvalConfig(model_path="runs/rl_demo/final", envs=[EnvEntryConfig(name="math")], n=64))
    report["envs"]["math"]["accuracy"], report["split"]      # split: "test" unless EvalConfig(split="dev" | "shifted")

Splits (k2post.envs.splits): test is the report, dev is for choosing settings, shifted measures
generalization to a held-out distribution shift; `draw_tasks` defaults to test.

The pieces are shared with the RL controller's in-loop eval (`k2post/rl/controller.py`):
`draw_tasks` (which tasks), `eval_work` (episode ids/options), `score_items` (what the reward
workers score) and `summarize` (accuracy, mean reward, truncation, response length per env).
`k2post eval` (pipelines/eval.py, k2post/evaluation/request.py) resolves a run dir to its model and prints
`report_table`; `evaluate_splits` runs several splits (one config each) on one engine build.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from k2post.envs.base import Environment, Task
from k2post.envs.reward_errors import RewardErrorsExceeded, error_samples, error_share_problem
from k2post.evaluation.config import EvalConfig
from k2post.rl.config import BudgetConfig
from k2post.rollout.agentic import EpisodeOptions


def draw_tasks(env: Environment, split: str = "test", n: int = 64, seed: int = 0) -> list[Task]:
    """`n` tasks of `split` (default test) for `seed`: the whole fixed split (dev, test, shifted; or n train
    tasks) shuffled by the seed, cut to n."""
    pool = list(env.tasks(split, seed=seed, n=n if split == "train" else None))
    random.Random(f"eval:{env.name}:{seed}").shuffle(pool)
    return pool[:n]


def eval_work(
    tasks: Mapping[str, Sequence[Task]],
    budget: BudgetConfig,
    temperature: float,
    samples: int,
    seed: int,
    prefix: str = "eval",
) -> list[tuple[tuple[str, Task], EpisodeOptions]]:
    """((env_name, task), episode options) for every task x sample: ids `<prefix>/<env>/<task>/<k>`."""
    work = []
    for name, env_tasks in tasks.items():
        for task in env_tasks:
            for k in range(samples):
                options = EpisodeOptions(
                    id=f"{prefix}/{name}/{task.id}/{k}",
                    temperature=temperature,
                    max_tokens=budget.budget_for(task.task_type),
                    max_reasoning_tokens=budget.reasoning_budget_for(task.task_type),
                    seed=seed * 1000 + k if temperature > 0 else None,
                )
                work.append(((name, task), options))
    return work


def final_text(episode: Any) -> str:
    """The last assistant message of a single-turn episode ('' when it wrote none)."""
    last = episode.messages[-1]
    return (last.content or "") if last.role == "assistant" else ""


def score_items(
    episodes: Sequence[Any], envs: Mapping[str, Environment], configs: Mapping[str, dict[str, Any]]
) -> list[Any]:
    """One `ScoreItem` per finished episode: multi-turn ones replay their turns, single-turn ones score the
    last reply.
    """
    from k2post.envs.workers import ScoreItem

    items = []
    for episode in episodes:
        config = dict(configs[episode.env_name])
        if envs[episode.env_name].multi_turn:
            items.append(
                ScoreItem(env=episode.env_name, task=episode.task, config=config, turns=list(episode.env_turns))
            )
        else:
            items.append(
                ScoreItem(env=episode.env_name, task=episode.task, config=config, response=final_text(episode))
            )
    return items


def summarize(episodes: Sequence[Any], rewards: Sequence[Any], threshold: float) -> dict[str, dict[str, float]]:
    """Per environment: n, accuracy (reward >= threshold), mean reward, truncation rate, mean response tokens,
    errors, and how many of them were infrastructure failures (scored again once by the pool, failed again).
    """
    out: dict[str, dict[str, float]] = {}
    for name in dict.fromkeys(e.env_name for e in episodes):
        pairs = [(e, r) for e, r in zip(episodes, rewards) if e.env_name == name]
        n = len(pairs)
        out[name] = {
            "n": n,
            "accuracy": sum(r.value >= threshold for _, r in pairs) / n,
            "mean_reward": sum(r.value for _, r in pairs) / n,
            "truncation_rate": sum(e.truncated for e, _ in pairs) / n,
            "response_tokens_mean": sum(sum(e.loss_mask) for e, _ in pairs) / n,
            "reward_errors": sum(r.error is not None for _, r in pairs),
            **best_baseline([r for _, r in pairs]),
            "reward_infra_failures": sum(bool(getattr(r, "infra_failure", False)) for _, r in pairs),
        }
    return out


def best_baseline(rewards: Sequence[Any]) -> dict[str, float]:
    """`{"baseline_best": x}`: the best mean over the single-feature judges a judging env reports per task in
    `Reward.info["baselines"]` (critic_calibration: more digits, longer, always A, ...), the figure to read beside
    its accuracy; empty for other envs."""
    totals: dict[str, list[float]] = {}
    for reward in rewards:
        baselines = reward.info.get("baselines") if isinstance(reward.info, dict) else None
        for name, value in (baselines or {}).items():
            totals.setdefault(name, []).append(float(value))
    if not totals:
        return {}
    return {"baseline_best": max(sum(values) / len(values) for values in totals.values())}


def episode_samples(
    episodes: Sequence[Any], rewards: Sequence[Any], per_env: int = 3
) -> dict[str, list[dict[str, Any]]]:
    """The first `per_env` episodes of each environment as readable transcripts (what the model wrote, and its
    reward).
    """
    out: dict[str, list[dict[str, Any]]] = {}
    for episode, reward in zip(episodes, rewards):
        shown = out.setdefault(episode.env_name, [])
        if len(shown) < per_env:
            messages = [
                m.model_dump(exclude_defaults=True, mode="json") for m in episode.messages if m.role != "system"
            ]
            shown.append({"task": episode.task.id, "reward": reward.value, "messages": messages})
    return out


def episode_outputs(episodes: Sequence[Any], rewards: Sequence[Any]) -> list[dict[str, Any]]:
    """Every episode's outcome, in order (a task's samples follow each other): env, task id, reward, error, the
    final answer and whether it was cut by the budget."""
    return [
        {
            "env": episode.env_name,
            "task": episode.task.id,
            "reward": reward.value,
            "error": reward.error,
            "response": final_text(episode) if episode.messages else "",
            "truncated": bool(episode.truncated),
        }
        for episode, reward in zip(episodes, rewards)
    ]


def mean_accuracy(per_env: Mapping[str, Mapping[str, float]]) -> float:
    """Unweighted mean of the environments' accuracies."""
    return sum(m["accuracy"] for m in per_env.values()) / max(len(per_env), 1)


def run_episodes(
    cfg: EvalConfig, work: list[tuple[tuple[str, Task], dict[str, Any]]], env_configs: dict[str, Any] | None = None
) -> list[Any]:
    """Every episode to the end on one in-process vLLM engine (greedy unless cfg.temperature > 0); `env_configs`
    (default cfg's) are the environments the episodes may come from."""
    from k2post.rollout.actor import RolloutWorker
    from k2post.rollout.config import SamplingConfig

    sampling = SamplingConfig(temperature=cfg.temperature, max_tokens=cfg.agentic.max_turn_tokens, logprobs=False)
    configs = cfg.env_configs() if env_configs is None else env_configs
    worker = RolloutWorker(cfg.model_path, cfg.engine, configs, cfg.agentic, sampling)
    try:
        return worker.run_episodes([item for item, _ in work], [options for _, options in work])
    finally:
        worker.engine.close()


def evaluate(cfg: EvalConfig) -> dict[str, Any]:
    """Run the evaluation; returns (and writes to cfg.report_path) the JSON report."""
    return evaluate_splits([cfg])[0]


def _shared_engine_problem(cfgs: Sequence[EvalConfig]) -> str | None:
    """Why `cfgs` cannot share one engine (None: they can): same model, engine, turns and temperature."""
    first = cfgs[0]
    for cfg in cfgs[1:]:
        for field in ("model_path", "engine", "agentic", "temperature"):
            if getattr(cfg, field) != getattr(first, field):
                return f"{field} differs between the {first.split} and {cfg.split} evals"
    return None


def evaluate_splits(cfgs: Sequence[EvalConfig]) -> list[dict[str, Any]]:
    """Evaluate several configs (typically one per split) on one engine: one model load and one engine build
    for all of them. Returns (and writes to each cfg.report_path) one report per config, in order."""
    from k2post.envs.workers import RewardPool

    if problem := _shared_engine_problem(cfgs):
        raise ValueError(f"cannot evaluate these on one engine: {problem}")
    started = time.perf_counter()
    envs = [{entry.name: entry.make() for entry in cfg.envs} for cfg in cfgs]
    works = [
        eval_work(
            {name: draw_tasks(env, cfg.split, cfg.n, cfg.seed) for name, env in cfg_envs.items()},
            cfg.budget,
            cfg.temperature,
            cfg.samples_per_task,
            cfg.seed,
            prefix="eval" if cfg.split == "test" else f"eval-{cfg.split}",
        )
        for cfg, cfg_envs in zip(cfgs, envs)
    ]
    env_configs = {name: config for cfg in cfgs for name, config in cfg.env_configs().items()}
    episodes = run_episodes(cfgs[0], [item for work in works for item in work], env_configs)
    reports, start = [], 0
    with RewardPool(num_workers=cfgs[0].reward_workers, timeout_s=cfgs[0].reward_timeout_s) as pool:
        for cfg, cfg_envs, work in zip(cfgs, envs, works):
            cfg_episodes, start = episodes[start : start + len(work)], start + len(work)
            rewards = pool.score_batch(score_items(cfg_episodes, cfg_envs, cfg.env_configs()))
            reports.append(build_report(cfg, cfg_episodes, rewards, time.perf_counter() - started))
    return reports


def build_report(cfg: EvalConfig, episodes: Sequence[Any], rewards: Sequence[Any], wall_s: float) -> dict[str, Any]:
    """The JSON report of one config's scored episodes (written to cfg.report_path when it is set)."""
    per_env = summarize(episodes, rewards, cfg.success_threshold)
    report = {
        "model": str(cfg.model_path),
        "split": cfg.split,
        "seed": cfg.seed,
        "n_per_env": cfg.n,
        "samples_per_task": cfg.samples_per_task,
        "temperature": cfg.temperature,
        "mean_accuracy": mean_accuracy(per_env),
        "envs": per_env,
        "env_configs": cfg.env_configs(),
        "samples": episode_samples(episodes, rewards),
        "episodes": episode_outputs(episodes, rewards),
        "reward_error_samples": error_samples([e.env_name for e in episodes], [r.error for r in rewards]),
        "wall_s": round(wall_s, 2),
    }
    if cfg.report_path:
        write_report(Path(cfg.report_path), report)
    return report


def check_report_errors(report: dict[str, Any], limit: float, field: str = "--max-reward-error-fraction") -> None:
    """RewardErrorsExceeded when more than `limit` of the report's rewards failed; names the first env's error."""
    failed = sum(m["reward_errors"] for m in report["envs"].values())
    total = sum(m["n"] for m in report["envs"].values())
    first = next((f"{name}: {texts[0]}" for name, texts in report["reward_error_samples"].items()), "")
    problem = error_share_problem(f"{report['split']} split", failed, total, limit, field, first)
    if problem:
        raise RewardErrorsExceeded(problem)


def write_report(path: Path, report: dict[str, Any]) -> None:
    """The JSON report, written atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(tmp, path)


def report_table(report: dict[str, Any]):
    """A rich table of the report (one row per environment, then the mean)."""
    from rich.table import Table

    table = Table(title=f"held-out {report['split']} accuracy: {report['model']} (seed {report['seed']})")
    for column in ("env", "n", "accuracy", "mean reward", "truncated", "resp. tokens", "reward errors"):
        table.add_column(column, justify="left" if column == "env" else "right")
    for name, m in report["envs"].items():
        table.add_row(
            name,
            str(m["n"]),
            f"{m['accuracy']:.3f}",
            f"{m['mean_reward']:.3f}",
            f"{m['truncation_rate']:.2f}",
            f"{m['response_tokens_mean']:.1f}",
            str(m["reward_errors"]),
        )
    table.add_row("[bold]mean", "", f"[bold]{report['mean_accuracy']:.3f}", "", "", "", "")
    return table
