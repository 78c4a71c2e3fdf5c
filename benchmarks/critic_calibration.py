"""Benchmark: the critic's agreement with the verifier on held-out pairs, before and after RL with critic_calibration.

Run: `python benchmarks/critic_calibration.py [--out runs/bench_critic] [--iterations 15] [--quick]
      [--smoke] [--pair-kind reference|malformed] [--judge-rows N] [--drop-uniform-groups]` (repo root), or
     `python benchmarks/critic_calibration.py --from-demo runs/demo_seeds [--seeds 0 1 2]`: the demo's own critic
     (configs/rl_demo.yaml trains critic_calibration beside the actor's envs) per seed of benchmarks/demo_seeds.py,
     read from the seeds' reports, with each seed's position prior; nothing is rerun.

`--quick`: a few-minute run (SFT of 30 steps on 300 math tasks, 2 RL iterations of 4 prompts x 4, 8 pairs and eval
tasks). `--smoke`: the least run that still goes through every step below (synth of 40 math tasks, 2 SFT steps,
1 RL iteration of 2 prompts x 2, 4 pairs and eval tasks; `k2post model / synth / critic / eval` in this process, `sft`
and `rl` in child processes as always: benchmarks/_k2post_cli.py): the test suite's check that the script runs end to
end and ends with its JSON line; its figures mean nothing.

`--pair-kind reference` (default; the steps below): the judge tells a correct math answer from a wrong number.
`--pair-kind malformed`: the judge tells a correct answer from a malformed one (no readable answer: separable by a
surface cue, the best single feature agrees 1.0; kept to compare with the older demo), in the compact
judge prompt; SFT gets `--judge-rows` such judging rows (critic_calibration train tasks answered with the verifier's
verdict) instead of math judging rows, held-out pairs are critic_calibration's test-split reference pairs (no
sampling), and nothing is harvested (on-policy pairs would be correct-vs-wrong-number pairs, the other kind).

1. SFT start: tiny-qwen2 + configs/synth_demo.yaml's math data with `--judge-share` of the math tasks written
   as pairwise judging rows (reference vs perturbed answer, verdict from the verifier) + configs/sft_demo.yaml;
2. held-out pairs: `k2post critic pairs SFT --split test` (the SFT model answers `--pair-tasks` test-split math
   prompts `--k` times; each prompt with mixed verifier results gives up to 2 (correct, wrong) pairs);
3. before: `k2post eval SFT` on those pairs (critic_calibration with `heldout_pairs_path`; accuracy =
   agreement: the greedy verdict names the verified-correct answer) and on math test tasks (the actor);
4. RL: `k2post rl` on math + critic_calibration (sources: math; its train pool starts with reference pairs and
   grows with on-policy pairs harvested from the run's own math groups), in-loop eval every `--eval-every`;
5. after: the same two evals on the RL model.
A critic that always says A, or guesses, agrees 0.5 (the correct answer's position is a seeded coin); the exact
figure for the held-out pairs is `position_prior` (the share of them with the correct answer at A), and
`surface_baseline` is the best single-feature judge on them (`surface_feature`: more digits, longer, shorter, always
A/B, larger number, even answer, the prompt's most frequent number, ...; `critic_calibration.best_surface_baseline`):
a critic's agreement means something only above both.
Prints a table, then one JSON line:
{"agreement_before": .., "agreement_after": .., "position_prior": .., "surface_baseline": .., "surface_feature": ..,
 "math_before": .., "math_after": .., "pairs": .., ...}
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._k2post_cli import run_cli  # noqa: E402

MATH = {"difficulty": 1, "problem_types": ["add", "sub", "mul", "word"]}
ANSWER_TOKENS, VERDICT_TOKENS = 32, 16


def cli(*args: str, log: Path, in_process: bool = False) -> float:
    """Run a `k2post` command (output to `log`); returns its seconds; a failure stops the benchmark with the log's
    tail. `in_process` (--smoke): model / synth / critic / eval in this process (benchmarks/_k2post_cli.py)."""
    return run_cli(args, log, in_process=in_process)


def calibration_config(args: argparse.Namespace) -> dict[str, Any]:
    """critic_calibration's config for `--pair-kind` (malformed pairs use the compact judge prompt)."""
    config: dict[str, Any] = {
        "sources": [{"name": "math", "config": MATH}],
        "answer_template": "The answer is {answer}.",
    }
    if args.pair_kind == "malformed":
        config.update(pair_kind="malformed", prompt_style="compact")
    return config


def synth_config(args: argparse.Namespace, out: Path) -> Path:
    """configs/synth_demo.yaml with the judging rows of `--pair-kind`, written under `out`."""
    import yaml

    config = yaml.safe_load((ROOT / "configs" / "synth_demo.yaml").read_text())
    config["out_dir"] = str(out / "synth")
    # the demo's own critic rows (lazy "[[A]]" + worked verdicts) give way to this benchmark's judging rows
    config["gym_tasks"] = [g for g in config["gym_tasks"] if g["env"] != "critic_calibration"]
    math = config["gym_tasks"][0]
    if args.quick:
        math["tasks"], config["tasks_per_domain"] = (40, 1) if args.smoke else (300, 1)
        for extra in config["gym_tasks"][1:]:
            extra["tasks"] = min(extra["tasks"], 8 if args.smoke else 40)
    if args.pair_kind == "reference":
        math["judge_share"] = args.judge_share
    elif args.judge_rows > 0:  # the critic_calibration gym's own tasks, answered with the verifier's verdict
        config["gym_tasks"].append(
            {
                "env": "critic_calibration",
                "config": calibration_config(args),
                "tasks": args.judge_rows,
                "answer_templates": {"[[{answer}]]": 1.0},
            }
        )
    path = out / "synth.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def sft_model(args: argparse.Namespace, out: Path, seconds: dict[str, float]) -> Path:
    """Model init + synth (math answers and judging rows) + SFT, each skipped when its output exists."""
    from k2post.models.loading import is_model_dir

    model, synth, sft = Path(args.base_model or out / "model"), out / "synth", out / "sft"
    if is_model_dir(sft / "final"):
        return sft / "final"
    if args.base_model and not is_model_dir(model):
        raise SystemExit(f"--base-model {args.base_model}: not a model dir (no config.json)")
    if not is_model_dir(model):
        cli(
            "model", "init", "--flavor", "tiny-qwen2", "--out", str(model), log=out / "model.log", in_process=args.smoke
        )
    seconds["synth"] = cli("synth", str(synth_config(args, out)), log=out / "synth.log", in_process=args.smoke)
    steps = ["train.max_steps=30"] if args.quick else []
    if args.smoke:  # no warm-up (it must be shorter than the run), no eval before the first step
        steps = ["train.max_steps=2", "schedule.warmup_steps=0", "train.eval_at_start=false"]
    seconds["sft"] = cli(
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


def rl_config(args: argparse.Namespace, model: Path, run_dir: Path, heldout: Path | None) -> dict[str, Any]:
    """Math + critic_calibration from the SFT model; the calibration env's held-out split is the on-policy pairs."""
    calibration = calibration_config(args)
    if heldout is not None:
        calibration["heldout_pairs_path"] = str(heldout)
    return {
        "kind": "rl",
        "run_dir": str(run_dir),
        "seed": args.seed,
        "model": {"path": str(model), "flavor": None},
        "envs": [
            {"name": "math", "config": MATH},
            {"name": "critic_calibration", "weight": args.critic_weight, "config": calibration},
        ],
        "rollout": {
            "prompts_per_iteration": args.prompts,
            "samples_per_prompt": args.k,
            "sleep_during_training": False,
            "engine": {"dtype": "float32", "max_model_len": 2048, "max_num_seqs": 160, "kv_cache_gib": 1.0},
            "agentic": {"max_turns": 1, "max_turn_tokens": ANSWER_TOKENS, "max_episode_tokens": ANSWER_TOKENS},
        },
        "loss": {
            "tau": 0.1,
            "groups_per_step": args.prompts // 2,
            "micro_batch_size": min(16, args.prompts // 2 * args.k),
            "max_steps_per_iteration": 2,
            "drop_uniform_groups": args.drop_uniform_groups,
        },
        "optim": {"lr": args.lr, "weight_decay": 0.0},
        "budget": {"default_max_tokens": ANSWER_TOKENS, "max_tokens": {"critic": VERDICT_TOKENS}, "penalty": "replace"},
        "temperature": {"default": {"kind": "linear", "start": 1.0, "end": 0.7, "decay_iterations": args.iterations}},
        "train": {
            "iterations": args.iterations,
            "prompt_pool_per_env": 512,
            "eval_every": args.eval_every,
            "eval_tasks_per_env": args.eval_n,
        },
        "schedule": {"kind": "cosine", "min_lr_ratio": 0.1},
        "checkpoint": {"every": 0, "keep": 1},
        "critic": {"harvest_pairs_per_group": 2 if args.pair_kind == "reference" else 0},
        "ray": {"num_cpus": 2, "cpus_per_bundle": 2},
    }


def heldout_pairs(
    args: argparse.Namespace, model: Path, config: Path, out: Path, seconds: dict[str, float]
) -> Path | None:
    """`k2post critic pairs` on the test split; None when no task had mixed results (then reference pairs are used)."""
    path = out / "heldout_pairs.jsonl"
    seconds["pairs"] = cli(
        "critic",
        "pairs",
        str(model),
        "--env",
        "math",
        "--env-config",
        str(config),
        "--split",
        "test",
        "--n",
        str(args.pair_tasks),
        "--k",
        str(args.k),
        "--max-tokens",
        str(ANSWER_TOKENS),
        "--out",
        str(path),
        log=out / "pairs.log",
        in_process=args.smoke,
    )
    return path if path.is_file() and path.read_text().strip() else None


def evaluate(model: Path, config: Path, out: Path, name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Greedy held-out accuracy of math (the actor) and critic_calibration (the critic's agreement)."""
    report = out / f"eval_{name}.json"
    cli(
        "eval",
        str(model),
        "--env-config",
        str(config),
        "--n",
        str(args.eval_n),
        "--out",
        str(report),
        log=out / f"eval_{name}.log",
        in_process=args.smoke,
    )
    return json.loads(report.read_text())["envs"]


def run_rl(args: argparse.Namespace, config: Path, out: Path, seconds: dict[str, float]) -> list[dict[str, Any]]:
    """`k2post rl`; returns its metrics rows."""
    from k2post.rl.metrics import read_metrics

    ray_tmp = tempfile.mkdtemp(prefix="k2c_", dir="/tmp")  # short: Ray's socket paths have a length limit
    try:
        seconds["rl"] = cli("rl", str(config), f"ray.temp_dir={ray_tmp}", log=out / "rl.log")
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    return read_metrics(out / "rl" / "metrics.jsonl")


def position_prior(config: Path, n: int) -> tuple[float, int]:
    """(share of the held-out judge tasks `k2post eval` draws with the correct answer at A, their count): an
    always-A judge's agreement."""
    import yaml

    from k2post.envs.registry import make_environment
    from k2post.evaluation.heldout import draw_tasks

    entry = next(e for e in yaml.safe_load(config.read_text())["envs"] if e["name"] == "critic_calibration")
    answers = [
        task.answer for task in draw_tasks(make_environment("critic_calibration", entry["config"]), "test", n, seed=0)
    ]
    return (sum(a == "A" for a in answers) / len(answers) if answers else 0.0), len(answers)


def surface_baseline(config: Path, n: int) -> tuple[str, float]:
    """(name, agreement) of the best single-feature judge (more digits, longer, always A, larger number, ...) on the
    held-out judge tasks `k2post eval` draws: the figure beside every agreement (a critic at or below it may be
    reading a surface cue, not checking the answer)."""
    import yaml

    from k2post.envs.registry import make_environment
    from k2post.evaluation.heldout import draw_tasks
    from k2post_environments.critic_calibration import best_surface_baseline

    entry = next(e for e in yaml.safe_load(config.read_text())["envs"] if e["name"] == "critic_calibration")
    return best_surface_baseline(draw_tasks(make_environment("critic_calibration", entry["config"]), "test", n, seed=0))


def print_table(
    before: dict[str, Any],
    after: dict[str, Any],
    curve: list[tuple[int, float]],
    harvested: int,
    prior: float,
    surface: tuple[str, float],
) -> None:
    print(f"{'held-out (greedy)':<34}{'before RL':>10}{'after RL':>10}")
    print(f"{'position prior (always [[A]])':<34}{prior:>10.3f}{prior:>10.3f}")
    label = f"best single feature ({surface[0]})"
    print(f"{label[:33]:<34}{surface[1]:>10.3f}{surface[1]:>10.3f}")
    for env, label in (("critic_calibration", "critic agreement with verifier"), ("math", "math accuracy (actor)")):
        print(f"{label:<34}{before[env]['accuracy']:>10.3f}{after[env]['accuracy']:>10.3f}")
    print(f"in-loop agreement by iteration: {curve}; on-policy judge tasks harvested: {harvested}")


def demo_figures(runs: Path, seeds: list[int]) -> dict[str, Any]:
    """The critic's test-split agreement before/after RL per demo_seeds seed (reports only), beside the position prior:
    the agreement of the better constant judge (always A or always B) on that seed's test pairs."""
    import statistics

    rows = []
    for seed in seeds:
        run = runs / f"seed{seed}"
        report = json.loads((run / "report.json").read_text())
        if "critic_calibration" not in report["envs"]:
            raise SystemExit(f"{run / 'report.json'}: no critic_calibration env in this demo run")
        pair = report["envs"]["critic_calibration"]
        at_a, _ = position_prior(run / "rl_config.yaml", pair["before"]["n"])
        feature, best = surface_baseline(run / "rl_config.yaml", pair["before"]["n"])
        rows.append(
            {
                "seed": seed,
                "before": pair["before"]["accuracy"],
                "after": pair["after"]["accuracy"],
                "at_a": at_a,
                "prior": max(at_a, 1 - at_a),
                "baseline": best,
                "baseline_feature": feature,
                "n": pair["before"]["n"],
            }
        )
    print(
        f"{'seed':<6}{'always A':>10}{'always B':>10}{'best feature':>14}{'before RL':>11}{'after RL':>10}{'pairs':>7}"
    )
    for row in rows:
        print(
            f"{row['seed']:<6}{row['at_a']:>10.3f}{1 - row['at_a']:>10.3f}{row['baseline']:>14.3f}"
            f"{row['before']:>11.3f}{row['after']:>10.3f}{row['n']:>7}"
        )
    mean = {key: statistics.fmean(row[key] for row in rows) for key in ("before", "after", "prior", "baseline")}
    return {
        "seeds": seeds,
        "agreement_before": mean["before"],
        "agreement_after": mean["after"],
        "position_prior": mean["prior"],
        "surface_baseline": mean["baseline"],
        "gain_over_start_min": min(row["after"] - row["before"] for row in rows),
        "gain_over_prior_min": min(row["after"] - row["prior"] for row in rows),
        "pair_kind": "the demo's (configs/rl_demo.yaml)",
        "per_seed": rows,
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="runs/bench_critic", help="work dir (the SFT model is reused when present)")
    parser.add_argument(
        "--base-model", default=None, help="HF model dir to SFT (default: a fresh tiny-qwen2 under --out)"
    )
    parser.add_argument(
        "--pair-kind",
        choices=("reference", "malformed"),
        default="reference",
        help="judging task: correct vs wrong number (reference) or correct vs malformed answer (malformed)",
    )
    parser.add_argument(
        "--judge-share", type=float, default=0.3, help="reference: share of math SFT tasks written as judging rows"
    )
    parser.add_argument(
        "--judge-rows", type=int, default=96, help="malformed: critic_calibration judging rows in the SFT data"
    )
    parser.add_argument("--iterations", type=int, default=15, help="RL iterations")
    parser.add_argument("--prompts", type=int, default=16, help="prompts per RL iteration")
    parser.add_argument("--k", type=int, default=8, help="samples per prompt (RL and pair sampling)")
    parser.add_argument("--lr", type=float, default=3e-4, help="RL learning rate")
    parser.add_argument(
        "--critic-weight", type=float, default=1.0, help="critic_calibration's prompt weight in the RL mix (math: 1)"
    )
    parser.add_argument(
        "--pair-tasks", type=int, default=128, help="test-split math prompts sampled for held-out pairs"
    )
    parser.add_argument("--eval-n", type=int, default=128, help="held-out tasks / pairs per environment at each eval")
    parser.add_argument("--eval-every", type=int, default=5, help="in-loop eval every N iterations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--drop-uniform-groups",
        action="store_true",
        help="train only on groups whose rewards differ (loss.drop_uniform_groups, as the demo does)",
    )
    parser.add_argument("--quick", action="store_true", help="a few-minute run (tiny SFT, 2 iterations)")
    parser.add_argument(
        "--smoke", action="store_true", help="the least end-to-end run (2 SFT steps, 1 iteration; the test suite's)"
    )
    parser.add_argument(
        "--from-demo",
        type=Path,
        default=None,
        help="read the critic's figures from benchmarks/demo_seeds.py's runs (its --out)",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="--from-demo: the seeds to read")
    args = parser.parse_args()
    if args.smoke:
        args.quick = True
        args.iterations, args.prompts, args.k, args.pair_tasks, args.eval_n, args.eval_every = 1, 2, 2, 4, 4, 1
    elif args.quick:
        args.iterations, args.prompts, args.k, args.pair_tasks, args.eval_n, args.eval_every = 2, 4, 4, 8, 8, 1
    return args


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    args = parse_args()
    if args.from_demo is not None:
        print(json.dumps(demo_figures(args.from_demo, args.seeds)))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import yaml

    seconds: dict[str, float] = {}
    model = sft_model(args, out, seconds)
    probe = out / "pairs_env.yaml"  # the pair sampler only needs the math entry
    probe.write_text(yaml.safe_dump(rl_config(args, model, out / "rl", None)))
    heldout = heldout_pairs(args, model, probe, out, seconds) if args.pair_kind == "reference" else None
    config = out / "rl.yaml"
    config.write_text(yaml.safe_dump(rl_config(args, model, out / "rl", heldout)))
    before = evaluate(model, config, out, "before", args)
    rows = run_rl(args, config, out, seconds)
    after = evaluate(out / "rl" / "final", config, out, "after", args)
    curve = [
        (r["iteration"], round(r["eval/critic_calibration/accuracy"], 3))
        for r in rows
        if "eval/critic_calibration/accuracy" in r
    ]
    harvested = int(rows[-1].get("calibration/harvested_tasks", 0))
    prior, n_prior = position_prior(config, args.eval_n)
    surface = surface_baseline(config, args.eval_n)
    print_table(before, after, curve, harvested, prior, surface)
    pairs = len(heldout.read_text().splitlines()) if heldout else n_prior
    print(
        json.dumps(
            {
                "agreement_before": before["critic_calibration"]["accuracy"],
                "agreement_after": after["critic_calibration"]["accuracy"],
                "position_prior": round(prior, 4),
                "surface_baseline": round(surface[1], 4),
                "surface_feature": surface[0],
                "pair_kind": args.pair_kind,
                "math_before": before["math"]["accuracy"],
                "math_after": after["math"]["accuracy"],
                "pairs": pairs,
                "heldout": "on-policy" if heldout else "reference",
                "n_eval": min(args.eval_n, pairs or args.eval_n),
                "harvested_tasks": harvested,
                "iterations": args.iterations,
                "agreement_curve": curve,
                "seconds": {k: round(v, 1) for k, v in seconds.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
