"""Benchmark: reward scoring throughput, in-process (DirectScorer) vs RewardPool worker processes.

Run: `python benchmarks/reward_throughput.py [--n 500] [--workers 2] [--env math] [--quick]`

Scores `n` responses to `math` tasks (a built-in; falls back to a small in-script env when the
math gym is not in the checkout): a mix of correct `\\boxed{}` answers, wrong numbers, LaTeX
that goes through math-verify (`\\sqrt{1764}`, `\\frac{84}{4} \\cdot 2`), prose and junk.
Both paths are warmed up first (the pool's workers have built the env). Prints a table, then
exactly one JSON line:
{"direct_scores_per_s": .., "pool_scores_per_s": .., "workers": .., "n": .., "env": ..}

The pool pays pickling + a pipe round trip per call and buys isolation and hard timeouts; it
scales with free cores (on a loaded 2-core machine expect at most ~1x-2x of direct).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's `environments` package

from k2post.envs import Environment, Reward, Task, register_environment, registered_environments
from k2post.envs.registry import make_environment
from k2post.envs.workers import DirectScorer, RewardPool, ScoreItem

FALLBACK_ENV = "bench_boxed"


@register_environment
class BenchBoxed(Environment):
    """Fallback: `\\boxed{}` integer answers to a + b (used when the math gym is missing)."""

    name = FALLBACK_ENV
    task_type = "math"

    def tasks(self, split="train", seed=0, n=None) -> Iterator[Task]:
        for i in range(100 if n is None else n):
            a, b = (seed + i) * 7 % 97, (seed + 3 * i) % 89
            yield Task(id=f"{split}-{seed}-{i}", env=self.name, task_type="math", messages=[], answer=str(a + b))

    def score(self, task: Task, response: str) -> Reward:
        found = re.findall(r"\\boxed\{([^{}]*)\}", response[-2000:])
        return Reward(value=float(bool(found) and found[-1].strip() == task.answer))


def _responses(answer: str, i: int) -> str:
    """A varied response for the i-th item: correct, wrong, LaTeX for math-verify, prose, junk."""
    number = int(answer) if answer.lstrip("-").isdigit() else 0
    kinds = [
        f"Adding up, we get \\boxed{{{answer}}}.",
        f"I think it is \\boxed{{{number + 1}}}",
        f"The result is \\boxed{{{'-' if number < 0 else ''}\\sqrt{{{number * number}}}}}",
        f"So x = \\boxed{{\\frac{{{2 * number}}}{{4}} \\cdot 2}}",
        "Let me think... " * 20 + f"so the answer is {answer}",
        "no idea {[( \\boxed{",
    ]
    return kinds[i % len(kinds)]


def build_items(env_name: str, n: int) -> list[ScoreItem]:
    env = make_environment(env_name)
    tasks = list(env.tasks("train", seed=0, n=min(n, 100)))
    picked = [tasks[i % len(tasks)] for i in range(n)]
    return [ScoreItem(env_name, task, _responses(str(task.answer), i)) for i, task in enumerate(picked)]


def time_direct(items: list[ScoreItem]) -> tuple[float, list[Reward]]:
    scorer = DirectScorer()
    scorer.score_batch(items[:5])  # warm-up: env built, imports done
    start = time.perf_counter()
    rewards = scorer.score_batch(items)
    return time.perf_counter() - start, rewards


def time_pool(items: list[ScoreItem], workers: int) -> tuple[float, list[Reward], float]:
    start = time.perf_counter()
    with RewardPool(num_workers=workers, timeout_s=30.0) as pool:
        pool.score_batch(items[: 4 * workers])  # warm-up: every worker builds the env
        ready_s = time.perf_counter() - start
        start = time.perf_counter()
        rewards = pool.score_batch(items)
        return time.perf_counter() - start, rewards, ready_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=500, help="responses to score (default 500)")
    parser.add_argument("--workers", type=int, default=2, help="pool workers (default 2)")
    parser.add_argument("--env", default=None, help="environment (default: math, else the in-script fallback)")
    parser.add_argument("--quick", action="store_true", help="n = 100")
    args = parser.parse_args()
    n = 100 if args.quick else args.n
    env_name = args.env or ("math" if "math" in registered_environments() else FALLBACK_ENV)
    items = build_items(env_name, n)
    direct_s, direct = time_direct(items)
    pool_s, pooled, ready_s = time_pool(items, args.workers)
    assert [r.value for r in direct] == [r.value for r in pooled], "pool and direct rewards differ"
    rows = [("direct (in-process)", 0, direct_s), (f"RewardPool ({args.workers} workers)", args.workers, pool_s)]
    print(
        f"env={env_name} n={n} cpus={os.cpu_count()} mean reward={sum(r.value for r in direct) / n:.3f} "
        f"pool start+warm-up={ready_s:.2f}s errors={sum(r.error is not None for r in pooled)}"
    )
    print(f"{'path':<26}{'seconds':>10}{'scores/s':>12}{'ms/score':>10}")
    for label, _, seconds in rows:
        print(f"{label:<26}{seconds:>10.3f}{n / seconds:>12.1f}{1000 * seconds / n:>10.2f}")
    figures = {
        "direct_scores_per_s": round(n / direct_s, 1),
        "pool_scores_per_s": round(n / pool_s, 1),
        "workers": args.workers,
        "n": n,
        "env": env_name,
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
