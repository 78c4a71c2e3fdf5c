"""`k2post eval MODEL_OR_RUN_DIR --env NAME [--env-config YAML] --n N --seed S [--split test|dev|shifted]`: held-out accuracy per environment.

    k2post eval runs/rl_demo --n 100 --seed 3                 # a run dir: its final model, its envs and budgets
    k2post eval artifacts/models/tiny-qwen2 --env math --env-config math.yaml --n 64
    k2post eval runs/sft_demo/final --env reasoning_gym --env-config configs/rl_demo.yaml   # env configs of an RL config

MODEL_OR_RUN_DIR is an HF model dir, or a run dir (its `final/`, else its newest `checkpoints/iter-N`).
`--env-config` is a YAML mapping: the config of the one `--env` it follows, or any run config with an
`envs:` list (each `--env` then takes its config, and the run's token budgets and turn limits, from
there). A run dir's own config.yaml supplies all of these by default. Prints a table and writes a JSON report
(default `<run or model dir>/eval/<envs>-n<N>-s<S>.json`, `...-s<S>-<split>.json` for a split other than test).
`--split`: test (default: the report), dev (choosing settings), shifted (a held-out distribution shift), train.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from k2post.config.loader import ConfigError, read_yaml


def resolve_model(target: str) -> tuple[Path, Path | None]:
    """(model dir, run dir or None) for an HF model dir or a run dir."""
    from k2post.models.loading import is_model_dir

    path = Path(target)
    if not path.is_dir():
        raise FileNotFoundError(f"{target!r} is not a directory (give an HF model dir or a run dir)")
    if is_model_dir(path):
        parent = path.parent.parent if path.parent.name == "checkpoints" else path.parent
        return path, (parent if (parent / "config.yaml").is_file() else None)
    if is_model_dir(path / "final"):
        return path / "final", path
    iters = sorted((int(p.name[5:]), p) for p in (path / "checkpoints").glob("iter-*") if p.name[5:].isdigit() and is_model_dir(p))
    if iters:
        return iters[-1][1], path
    raise FileNotFoundError(f"{target!r} holds no model: neither config.json, final/ nor checkpoints/iter-N/ (train first, or give a model dir)")


def env_configs_from(data: dict[str, Any], names: list[str], source: str) -> dict[str, dict[str, Any]]:
    """Configs by env name from a YAML mapping: a run config's `envs:` list, or one env's config."""
    if "envs" in data:
        listed = {entry.get("name"): entry.get("config", {}) for entry in data["envs"] if isinstance(entry, dict)}
        return {name: listed[name] for name in names if name in listed}
    if len(names) != 1:
        raise ConfigError(f"{source}: a plain env config needs exactly one --env (got {names}); use a file with an `envs:` list")
    return {names[0]: data}


def _run_settings(run_dir: Path | None, env_config_files: list[str]) -> dict[str, Any]:
    """Budget and turn limits of the run dir's config.yaml, then of any run config given with --env-config."""
    settings: dict[str, Any] = {}
    sources = ([read_yaml(run_dir / "config.yaml")] if run_dir is not None else []) + [read_yaml(p) for p in env_config_files]
    for data in sources:
        if "envs" in data:  # a run config
            settings.update({k: data[k] for k in ("budget",) if k in data})
            if data.get("rollout", {}).get("agentic"):
                settings["agentic"] = {**data["rollout"]["agentic"], "iteration_token_budget": None}
    return settings


def _listed_envs(data: dict[str, Any]) -> list[str]:
    return [entry["name"] for entry in data.get("envs", []) if isinstance(entry, dict) and "name" in entry]


def _env_names(args: argparse.Namespace, run: dict[str, Any]) -> list[str]:
    """--env names, else the run dir's envs, else those of the first --env-config run config with an `envs:` list."""
    names = args.env or _listed_envs(run)
    for path in args.env_config or []:
        names = names or _listed_envs(read_yaml(path))
    if not names:
        raise ConfigError(f"{args.target}: name at least one --env (neither a run dir nor an --env-config with an `envs:` list)")
    return names


def report_name(names: list[str], n: int, seed: int, split: str) -> str:
    """Default report file name: `<envs>-n<N>-s<S>.json`, with `-<split>` before `.json` unless the split is test."""
    suffix = "" if split == "test" else f"-{split}"
    return f"{'+'.join(names)}-n{n}-s{seed}{suffix}.json"


def build_eval_config(args: argparse.Namespace):
    """The validated EvalConfig of the command line (one-line errors name the flag or file)."""
    from k2post.config.loader import validate_config
    from k2post.evaluation.config import EvalConfig

    model_dir, run_dir = resolve_model(args.target)
    run = read_yaml(run_dir / "config.yaml") if run_dir is not None else {}
    names = _env_names(args, run)
    configs = env_configs_from(run, names, f"{run_dir}/config.yaml") if "envs" in run else {}
    for path in args.env_config or []:
        configs.update(env_configs_from(read_yaml(path), names, path))
    settings = _run_settings(run_dir, args.env_config or [])
    budget = dict(settings.get("budget", {}), penalty="none")
    if args.max_tokens is not None:
        budget = {"default_max_tokens": args.max_tokens, "max_tokens": {}, "penalty": "none"}
    out = args.out or str((run_dir or model_dir) / "eval" / report_name(names, args.n, args.seed, args.split))
    raw = {"model_path": str(model_dir), "envs": [{"name": n, "config": configs.get(n, {})} for n in names],
           "n": args.n, "seed": args.seed, "split": args.split, "samples_per_task": args.samples,
           "temperature": args.temperature, "budget": budget, "report_path": out}
    if "agentic" in settings:
        raw["agentic"] = settings["agentic"]
    return validate_config(EvalConfig, raw, "k2post eval")


def cmd_eval(args: argparse.Namespace) -> int:
    """Run the evaluation; print the table and where the report went."""
    from rich.console import Console

    from k2post.evaluation.heldout import evaluate, report_table

    cfg = build_eval_config(args)
    report = evaluate(cfg)
    console = Console(width=120)
    console.print(report_table(report))
    console.print(f"report: {cfg.report_path}")
    return 0


def add_eval_parser(sub: argparse._SubParsersAction) -> None:
    command = sub.add_parser("eval", help="held-out accuracy per environment of a model or run dir (vLLM, isolated scoring)")
    command.add_argument("target", metavar="MODEL_OR_RUN_DIR", help="HF model dir, or a run dir (its final/ or newest checkpoint)")
    command.add_argument("--env", action="append", metavar="NAME", help="environment to evaluate on (repeatable; default: the run's envs, or those of --env-config)")
    command.add_argument("--env-config", action="append", metavar="YAML", help="env config, or a run config with an `envs:` list (repeatable)")
    command.add_argument("--n", type=int, default=64, help="held-out tasks per environment (default 64)")
    command.add_argument("--seed", type=int, default=0, help="seed of the task draw (default 0)")
    command.add_argument("--split", choices=("test", "dev", "shifted", "train"), default="test",
                         help="task split: test (default, the report), dev (choosing settings), shifted (generalization), train")
    command.add_argument("--samples", type=int, default=1, help="episodes per task; >1 needs --temperature > 0 (avg@k)")
    command.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    command.add_argument("--max-tokens", type=int, default=None, help="token budget of every task type (default: the run's budgets, else 256)")
    command.add_argument("--out", default=None, help="report path (default <run or model dir>/eval/<envs>-n<N>-s<S>.json)")
    command.set_defaults(func=cmd_eval)
