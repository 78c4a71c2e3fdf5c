"""What `k2post eval` (and `k2post critic pairs`) asks for, resolved into an `EvalConfig`.

    request = EvalRequest(target="runs/rl_demo", n=100, seed=3)              # a run dir: its model, envs, budgets
    cfg = build_eval_config(EvalRequest(target="artifacts/models/tiny-qwen2", envs=["math"], env_configs=["m.yaml"]))

`target` is an HF model dir, or a run dir (its `final/`, else its newest `checkpoints/iter-N`).
`env_configs` are YAML mappings: the config of the one env named, or any run config with an `envs:`
list (each env then takes its config, and the run's token budgets and turn limits, from there). A run
dir's own config.yaml supplies all of these by default. The report goes to `out`, by default
`<run or model dir>/eval/<envs>-n<N>-s<S>.json` (`...-s<S>-<split>.json` for a split other than test).
The command line that fills an `EvalRequest` is pipelines/eval.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from k2post.config.loader import ConfigError, read_yaml
from k2post.envs.registry import absolute_reference, is_reference, resolve_name


@dataclass(frozen=True)
class EvalRequest:
    """The flags of `k2post eval`, before a run dir or a run config fills in the rest."""

    target: str
    envs: list[str] = field(default_factory=list)
    env_configs: list[str] = field(default_factory=list)
    n: int = 64
    seed: int = 0
    split: str = "test"
    samples: int = 1
    temperature: float = 0.0
    max_tokens: int | None = None
    out: str | None = None
    max_reward_error_fraction: float | None = None
    dtype: str | None = None  # engine dtype (None: the EvalConfig default, float32)


def resolve_model(target: str) -> tuple[Path, Path | None]:
    """(model dir, run dir or None) for an HF model dir or a run dir."""
    from k2post.models.config import is_model_dir

    path = Path(target)
    if not path.is_dir():
        raise FileNotFoundError(f"{target!r} is not a directory (give an HF model dir or a run dir)")
    if is_model_dir(path):
        parent = path.parent.parent if path.parent.name == "checkpoints" else path.parent
        return path, (parent if (parent / "config.yaml").is_file() else None)
    if is_model_dir(path / "final"):
        return path / "final", path
    iters = sorted(
        (int(p.name[5:]), p) for p in (path / "checkpoints").glob("iter-*") if p.name[5:].isdigit() and is_model_dir(p)
    )
    if iters:
        return iters[-1][1], path
    raise FileNotFoundError(
        f"{target!r} holds no model: neither config.json, final/ nor checkpoints/iter-N/ "
        "(train first, or give a model dir)"
    )


def _listed(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A run config's `envs:` entries by registered name: a `file.py:Class` / `module:Class` name or a saved
    `plugin` is loaded as `k2post rl` loads it (k2post.envs.registry.resolve_name), its reference kept."""
    listed = {}
    for entry in data.get("envs", []):
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            name, plugin = resolve_name(entry["name"], entry.get("plugin"))
            listed[name] = {"config": entry.get("config", {}), "plugin": plugin}
    return listed


def env_configs_from(data: dict[str, Any], names: list[str], source: str) -> dict[str, dict[str, Any]]:
    """Configs by env name from a YAML mapping: a run config's `envs:` list, or one env's config."""
    if "envs" in data:
        listed = _listed(data)
        return {name: listed[name]["config"] for name in names if name in listed}
    if len(names) != 1:
        raise ConfigError(
            f"{source}: a plain env config needs exactly one --env (got {names}); use a file with an `envs:` list"
        )
    return {names[0]: data}


def _run_settings(run_dir: Path | None, env_config_files: list[str]) -> dict[str, Any]:
    """Budget and turn limits of the run dir's config.yaml, then of any run config given with --env-config."""
    settings: dict[str, Any] = {}
    sources = ([read_yaml(run_dir / "config.yaml")] if run_dir is not None else []) + [
        read_yaml(p) for p in env_config_files
    ]
    for data in sources:
        if "envs" in data:  # a run config
            settings.update({k: data[k] for k in ("budget",) if k in data})
            if data.get("rollout", {}).get("agentic"):
                settings["agentic"] = {**data["rollout"]["agentic"], "iteration_token_budget": None}
    return settings


def _listed_envs(data: dict[str, Any]) -> list[str]:
    return list(_listed(data))


def _env_names(request: EvalRequest, run: dict[str, Any]) -> list[str]:
    """The named envs (a reference resolved to its registered name), else the run dir's envs, else those of the
    first env config with an `envs:` list."""
    names = [resolve_name(name)[0] for name in request.envs] or _listed_envs(run)
    for path in request.env_configs:
        names = names or _listed_envs(read_yaml(path))
    if not names:
        raise ConfigError(
            f"{request.target}: name at least one --env (neither a run dir nor an --env-config with an `envs:` list)"
        )
    return names


def report_name(names: list[str], n: int, seed: int, split: str) -> str:
    """Default report file name: `<envs>-n<N>-s<S>.json`, with `-<split>` before `.json` unless the split is test."""
    suffix = "" if split == "test" else f"-{split}"
    return f"{'+'.join(names)}-n{n}-s{seed}{suffix}.json"


def _env_entries(request: EvalRequest, run_dir: Path | None, names: list[str]) -> list[dict[str, Any]]:
    """`envs:` entries (name + config, + plugin: where a referenced class is loaded from) from the run dir's config,
    then from each env config file and --env (later wins)."""
    run = read_yaml(run_dir / "config.yaml") if run_dir is not None else {}
    configs = env_configs_from(run, names, f"{run_dir}/config.yaml") if "envs" in run else {}
    plugins = {name: entry["plugin"] for name, entry in _listed(run).items() if entry["plugin"]}
    for path in request.env_configs:
        data = read_yaml(path)
        configs.update(env_configs_from(data, names, path))
        plugins.update((name, entry["plugin"]) for name, entry in _listed(data).items() if entry["plugin"])
    plugins.update((resolve_name(name)[0], absolute_reference(name)) for name in request.envs if is_reference(name))
    return [{"name": n, "config": configs.get(n, {})} | ({"plugin": plugins[n]} if n in plugins else {}) for n in names]


def build_eval_config(request: EvalRequest):
    """The validated EvalConfig of a request (one-line ConfigErrors name the flag or the file)."""
    from k2post.config.loader import validate_config
    from k2post.evaluation.config import EvalConfig

    model_dir, run_dir = resolve_model(request.target)
    names = _env_names(request, read_yaml(run_dir / "config.yaml") if run_dir is not None else {})
    settings = _run_settings(run_dir, list(request.env_configs))
    budget = dict(settings.get("budget", {}), penalty="none")
    if request.max_tokens is not None:
        budget = {"default_max_tokens": request.max_tokens, "max_tokens": {}, "penalty": "none"}
    default_out = (run_dir or model_dir) / "eval" / report_name(names, request.n, request.seed, request.split)
    raw = {
        "model_path": str(model_dir),
        "envs": _env_entries(request, run_dir, names),
        "n": request.n,
        "seed": request.seed,
        "split": request.split,
        "samples_per_task": request.samples,
        "temperature": request.temperature,
        "budget": budget,
        "report_path": request.out or str(default_out),
    }
    if request.max_reward_error_fraction is not None:
        raw["max_reward_error_fraction"] = request.max_reward_error_fraction
    if "agentic" in settings:
        raw["agentic"] = settings["agentic"]
    if request.dtype is not None:
        raw["engine"] = {**EvalConfig.model_fields["engine"].default_factory().model_dump(), "dtype": request.dtype}
    return validate_config(EvalConfig, raw, "command line")
