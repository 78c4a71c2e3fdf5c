"""Benchmark: k2post RL (vLLM rollouts, DeepSpeed + MuonClip trainer, Ray) vs TRL's GRPOTrainer, both on this CPU.

Run: `python benchmarks/rl_vs_trl.py [--sft-model runs/demo/sft/final] [--iterations 20] [--quick | --smoke]`
(repo root). `--quick`: 2 iterations of 4 prompts x 4, eval on 8 tasks. `--smoke`: the least run through every step
(a 2-step SFT start when it is built here, 1 iteration of 2 prompts x 2, eval on 4 tasks; `k2post model / synth / eval`
in this process, `sft` and `rl` in child processes as always: benchmarks/_k2post_cli.py): the test suite's check that
the script runs end to end and ends with its JSON line; its figures mean nothing.

Same tiny model and SFT start (the demo's: `--sft-model`, else built here with configs/synth_demo.yaml +
configs/sft_demo.yaml), same task (reasoning-gym chain_sum, which the SFT model mostly answers in a style the env
does not read), same prompt budget
(`--iterations` x `--prompts` prompts x `--k` samples each, drawn from the same train pool), same reward
(the gym's scorer), same held-out eval (greedy vLLM on `--eval-n` test-split tasks, scored by the gym):
- k2post: `k2post rl` with one env; held-out accuracy from its in-loop eval every `--eval-every` iterations;
- TRL: GRPOTrainer (HF generate, AdamW, beta 0, its default loss), one optimizer step per `--prompts` x `--k`
  completions, at each lr of `--trl-lrs` (a small sweep in TRL's favour: the best final accuracy is the
  reference); its model is saved every `--eval-every` steps (untimed) and evaluated afterwards with
  `k2post eval` (the same tasks, budget and scorer as k2post's in-loop eval).
Time axis: training-loop seconds (rollout + reward + train + push for k2post; TRL's steps), evaluation and
checkpoint saves excluded; setup (Ray, engines, model load) is reported apart.
Prints a table of held-out accuracy vs time for both, then one JSON line:
{"k2post_final_acc": .., "trl_final_acc": .., "k2post_s_to_trl_acc": .., "trl_s": .., "time_ratio": .., ...}
time_ratio = k2post's seconds to first reach TRL's final accuracy / TRL's seconds (goal <= 0.5); when TRL ends
where it started, that is reached at second 0 (the JSON also has both curves and the sweep).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._k2post_cli import run_cli  # noqa: E402

CHAIN_SUM = {
    "dataset": "chain_sum",
    "dataset_config": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1},
}
MAX_TOKENS = 32
EVAL_SECONDS = ("time/eval_s",)


def cli(*args: str, log: Path, in_process: bool = False) -> None:
    """Run a `k2post` command; its output goes to `log`; a failure stops the benchmark with the log's tail.
    `in_process` (--smoke): model / synth / eval in this process (benchmarks/_k2post_cli.py)."""
    run_cli(args, log, in_process=in_process)


def ensure_sft_model(args: argparse.Namespace, out: Path) -> Path:
    """The SFT start: --sft-model if it exists, else model init + synth + SFT with the demo's configs under out/."""
    from k2post.models.loading import is_model_dir

    if args.sft_model and is_model_dir(args.sft_model):
        return Path(args.sft_model)
    model, synth, sft = out / "model", out / "synth", out / "sft"
    if not is_model_dir(sft / "final"):
        if not is_model_dir(model):
            cli(
                "model",
                "init",
                "--flavor",
                "tiny-qwen2",
                "--out",
                str(model),
                log=out / "model.log",
                in_process=args.smoke,
            )
        quick = ["gym_tasks.0.tasks=200", "gym_tasks.1.tasks=40", "tasks_per_domain=2"] if args.quick else []
        steps = ["train.max_steps=20"] if args.quick else []
        if args.smoke:  # every gym's rows, a handful each; SFT: no warm-up, no eval before the first step
            quick = ["gym_tasks.0.tasks=40", *(f"gym_tasks.{i}.tasks=8" for i in range(1, 5)), "tasks_per_domain=1"]
            steps = ["train.max_steps=2", "schedule.warmup_steps=0", "train.eval_at_start=false"]
        cli(
            "synth", "configs/synth_demo.yaml", f"out_dir={synth}", *quick, log=out / "synth.log", in_process=args.smoke
        )
        cli(
            "sft",
            "configs/sft_demo.yaml",
            f"run_dir={sft}",
            f"model.path={model}",
            "model.flavor=null",
            f"data.path={synth / 'dataset'}",
            *steps,
            log=out / "sft.log",
        )
    return sft / "final"


def rl_config(args: argparse.Namespace, model: Path, run_dir: Path) -> dict[str, Any]:
    return {
        "kind": "rl",
        "run_dir": str(run_dir),
        "seed": args.seed,
        "model": {"path": str(model), "flavor": None},
        "envs": [{"name": "reasoning_gym", "config": CHAIN_SUM}],
        "rollout": {
            "prompts_per_iteration": args.prompts,
            "samples_per_prompt": args.k,
            "sleep_during_training": False,
            "engine": {"dtype": "float32", "max_model_len": 512, "max_num_seqs": 256, "kv_cache_gib": 0.5},
            "agentic": {"max_turns": 1, "max_turn_tokens": MAX_TOKENS, "max_episode_tokens": MAX_TOKENS},
        },
        "loss": {
            "tau": 0.1,
            "groups_per_step": args.prompts // 2,
            "micro_batch_size": min(16, args.prompts // 2 * args.k),
            "max_steps_per_iteration": 2,
        },
        "optim": {"lr": args.k2post_lr, "weight_decay": 0.0},
        "budget": {"default_max_tokens": MAX_TOKENS, "penalty": "replace"},
        "temperature": {"default": {"kind": "constant", "start": 1.0, "end": 1.0}},
        "train": {
            "iterations": args.iterations,
            "prompt_pool_per_env": args.pool,
            "eval_every": args.eval_every,
            "eval_tasks_per_env": args.eval_n,
        },
        "checkpoint": {"every": 0, "keep": 1},
        "ray": {"num_cpus": 2, "cpus_per_bundle": 2},
    }


def run_k2post(args: argparse.Namespace, model: Path, out: Path) -> tuple[list[tuple[float, float]], float, Path]:
    """(loop seconds, held-out accuracy) points, total wall seconds, and the RL config file."""
    import yaml

    from k2post.rl.metrics import read_metrics

    run_dir = out / "k2post"
    config = out / "k2post_rl.yaml"
    config.write_text(yaml.safe_dump(rl_config(args, model, run_dir)))
    ray_tmp = tempfile.mkdtemp(prefix="k2b_", dir="/tmp")  # short: Ray's socket paths have a length limit
    started = time.perf_counter()
    try:
        cli("rl", str(config), f"ray.temp_dir={ray_tmp}", log=out / "k2post.log")
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    wall = time.perf_counter() - started
    points, clock = [], 0.0
    for row in read_metrics(run_dir / "metrics.jsonl"):
        clock += sum(
            v
            for k, v in row.items()
            if k.startswith("time/") and k.endswith("_s") and k not in EVAL_SECONDS and k != "time/trainer_step_s"
        )
        if "eval/mean_accuracy" in row:
            points.append((round(clock, 2), row["eval/reasoning_gym/accuracy"]))
    return points, wall, config


def trl_dataset(args: argparse.Namespace):
    """The same train pool k2post samples from (env.tasks('train', seed, pool)), as TRL conversational prompts."""
    from datasets import Dataset

    from k2post.envs.mix import EnvEntryConfig

    env = EnvEntryConfig(name="reasoning_gym", config=CHAIN_SUM).make()
    tasks = list(env.tasks("train", seed=args.seed, n=args.pool))
    return Dataset.from_dict(
        {
            "prompt": [[{"role": m.role, "content": m.content} for m in t.messages] for t in tasks],
            "task": [t.model_dump_json() for t in tasks],
        }
    ), env


def make_reward(env):
    from k2post.envs.base import Task

    def chain_sum_reward(prompts, completions, task, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [env.score(Task.model_validate_json(t), text).value for t, text in zip(task, texts)]

    return chain_sum_reward


def run_trl(
    args: argparse.Namespace, model: Path, out: Path, lr: float
) -> tuple[list[tuple[float, Path]], float, float]:
    """(loop seconds, saved model dir) every eval_every steps (step 0 = the start), TRL's loop seconds, setup
    seconds."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    setup_started = time.perf_counter()
    dataset, env = trl_dataset(args)
    tokenizer = AutoTokenizer.from_pretrained(model)
    policy = AutoModelForCausalLM.from_pretrained(model, dtype="float32")
    config = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=args.k * 2,
        gradient_accumulation_steps=args.prompts // 2,
        num_generations=args.k,
        max_completion_length=MAX_TOKENS,
        learning_rate=lr,
        beta=0.0,
        temperature=1.0,
        max_steps=args.iterations,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        seed=args.seed,
        lr_scheduler_type="constant",
        warmup_steps=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    saved: list[tuple[float, Path]] = []

    class SaveEvery(TrainerCallback):
        """Saves the policy every eval_every steps; save time is kept off the clock."""

        def __init__(self) -> None:
            self.started, self.paused = 0.0, 0.0

        def on_train_begin(self, *_, **__):
            self.started = time.perf_counter()

        def on_step_end(self, _args, state, *_, **__):
            if state.global_step % args.eval_every == 0 or state.global_step == args.iterations:
                pause = time.perf_counter()
                target = out / f"step-{state.global_step}"
                trainer.model.save_pretrained(target)
                tokenizer.save_pretrained(target)
                saved.append((round(pause - self.started - self.paused, 2), target))
                self.paused += time.perf_counter() - pause

    callback = SaveEvery()
    trainer = GRPOTrainer(
        model=policy,
        reward_funcs=make_reward(env),
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[callback],
    )
    setup_s = time.perf_counter() - setup_started
    trainer.train()
    loop_s = time.perf_counter() - callback.started - callback.paused
    return [(0.0, model), *saved], loop_s, setup_s


def eval_model(model_dir: Path, rl_config_file: Path, args: argparse.Namespace, report: Path) -> float:
    """Held-out accuracy with `k2post eval` (k2post's in-loop eval's tasks, budget and scorer)."""
    report.parent.mkdir(parents=True, exist_ok=True)
    cli(
        "eval",
        str(model_dir),
        "--env",
        "reasoning_gym",
        "--env-config",
        str(rl_config_file),
        "--n",
        str(args.eval_n),
        "--seed",
        str(args.seed),
        "--out",
        str(report),
        log=report.with_suffix(".log"),
        in_process=args.smoke,
    )
    return json.loads(report.read_text())["envs"]["reasoning_gym"]["accuracy"]


def run_trl_sweep(args: argparse.Namespace, model: Path, out: Path, config: Path) -> dict[str, Any]:
    """TRL at each --trl-lrs value; the best final accuracy (then the fastest) is the reference, its curve evaluated."""
    runs = []
    for lr in args.trl_lrs:
        saved, loop_s, setup_s = run_trl(args, model, out / f"trl_lr{lr:g}", lr)
        final = eval_model(saved[-1][1], config, args, out / f"trl_lr{lr:g}" / "eval_final.json")
        runs.append({"lr": lr, "saved": saved, "loop_s": loop_s, "setup_s": setup_s, "final_acc": final})
    best = max(runs, key=lambda r: (r["final_acc"], -r["loop_s"]))
    best["curve"] = [
        (seconds, eval_model(path, config, args, out / "trl_curve" / f"{i}.json"))
        for i, (seconds, path) in enumerate(best["saved"][:-1])
    ] + [(best["saved"][-1][0], best["final_acc"])]
    return {"best": best, "finals": {f"{r['lr']:g}": r["final_acc"] for r in runs}}


def seconds_to_reach(points: list[tuple[float, float]], target: float) -> float | None:
    return next((seconds for seconds, acc in points if acc >= target), None)


def print_table(k2: list[tuple[float, float]], trl: list[tuple[float, float]]) -> None:
    print("| run | loop seconds | held-out accuracy |\n| --- | ---: | ---: |")
    for name, points in (("k2post", k2), ("TRL GRPO", trl)):
        for seconds, acc in points:
            print(f"| {name} | {seconds:.1f} | {acc:.3f} |")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sft-model", default="runs/demo/sft/final", help="SFT start (built here when missing)")
    parser.add_argument("--out", default="runs/bench_rl_vs_trl", help="work dir (runs, saved models, logs)")
    parser.add_argument("--iterations", type=int, default=20, help="k2post iterations = TRL optimizer steps")
    parser.add_argument("--prompts", type=int, default=16, help="prompts per iteration / TRL step")
    parser.add_argument("--k", type=int, default=8, help="samples per prompt (K = num_generations)")
    parser.add_argument("--pool", type=int, default=512, help="train prompts drawn from the gym")
    parser.add_argument("--eval-n", type=int, default=128, help="held-out tasks")
    parser.add_argument("--eval-every", type=int, default=4, help="iterations / steps between evaluations")
    parser.add_argument("--k2post-lr", type=float, default=2e-4, help="MuonClip lr of k2post")
    parser.add_argument(
        "--trl-lrs",
        type=lambda text: [float(v) for v in text.split(",")],
        default=[1e-4, 3e-4, 1e-3],
        help="AdamW lrs tried for TRL (comma-separated); the best final accuracy is the reference",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--quick", action="store_true", help="2 iterations of 4 prompts x 4, eval on 8 tasks (a short run)"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="1 iteration of 2 prompts x 2, eval on 4 tasks (the test suite's run)"
    )
    args = parser.parse_args()
    if args.smoke:
        args.iterations, args.prompts, args.k, args.pool, args.eval_n, args.eval_every = 1, 2, 2, 8, 4, 1
        args.trl_lrs = args.trl_lrs[:1]
    elif args.quick:
        args.iterations, args.prompts, args.k, args.pool, args.eval_n, args.eval_every = 2, 4, 4, 32, 8, 1
        args.trl_lrs = args.trl_lrs[:1]
    return args


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    args = parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = ensure_sft_model(args, out)
    k2_points, k2_wall, config_file = run_k2post(args, model, out)
    sweep = run_trl_sweep(args, model, out, config_file)
    best = sweep["best"]
    trl_points, trl_s = best["curve"], best["loop_s"]
    print_table(k2_points, trl_points)
    print(f"TRL lr sweep (final held-out accuracy): {sweep['finals']} -> reference lr {best['lr']:g}")
    trl_final = trl_points[-1][1]
    reach = seconds_to_reach(k2_points, trl_final)
    figures = {
        "k2post_final_acc": k2_points[-1][1],
        "trl_final_acc": trl_final,
        "k2post_s_to_trl_acc": reach,
        "trl_s": round(trl_s, 2),
        "time_ratio": round(reach / trl_s, 3) if reach is not None and trl_s > 0 else None,
        "k2post_loop_s": k2_points[-1][0],
        "k2post_wall_s": round(k2_wall, 1),
        "trl_setup_s": round(best["setup_s"], 1),
        "trl_lr": best["lr"],
        "trl_lr_sweep": sweep["finals"],
        "start_acc": k2_points[0][1],
        "iterations": args.iterations,
        "prompts": args.prompts,
        "k": args.k,
        "k2post_curve": k2_points,
        "trl_curve": trl_points,
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
