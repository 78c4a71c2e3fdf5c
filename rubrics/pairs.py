"""On-policy calibration pairs from a model: sample K answers per verifiable prompt, keep (correct, wrong) pairs.

    cfg = build_eval_config(EvalRequest(target="runs/demo/sft/final", envs=["math"], samples=8, temperature=1.0))
    pairs = build_pairs(cfg, pairs_per_task=2)

The command is `k2post critic pairs` (pipelines/critic.py):

    k2post critic pairs runs/demo/sft/final --env math --env-config configs/rl_critic.yaml --split test --n 64 --k 8 \\
        --out runs/critic/heldout_pairs.jsonl

The model answers each task K times (vLLM in this process, temperature `--temperature`); the
environment's verifier scores the answers in isolated workers; every task with mixed results
gives up to `--pairs-per-task` pairs (`k2post.judging.calibration.pairs_from_group`). The file is what
`critic_calibration`'s `heldout_pairs_path` / `train_pairs_path` read: held-out pairs from the
test split are how the critic's agreement with the verifier is measured before and after RL.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from k2post.judging.calibration import CalibrationPair, pairs_from_group


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
    return [
        (name, by_id[(name, tid)], [a for a, _ in rows], [v for _, v in rows]) for (name, tid), rows in groups.items()
    ]


def build_pairs(cfg: Any, pairs_per_task: int) -> list[CalibrationPair]:
    """Every mixed group's pairs, in task order."""
    return [
        pair
        for name, task, answers, rewards in sampled_groups(cfg)
        for pair in pairs_from_group(name, task, answers, rewards, cfg.success_threshold, pairs_per_task, cfg.seed)
    ]
