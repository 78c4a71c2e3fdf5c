"""The recipe end to end (what `make demo` runs): model -> synth -> SFT -> eval -> RL -> eval, then a report.

    python -m k2post_pipelines.recipe configs/recipe_demo.yaml [key.path=value ...]
    k2post recipe configs/recipe_demo.yaml rl_overrides='[train.iterations=10]'

Each stage is the same `k2post` command a user would type (`model init`, `synth`, `sft`, `eval`,
`rl`, `eval`), run as a child process with the paths chained under `run_dir`; its whole output
goes to `run_dir/logs/<stage>.log` and the essentials to the console. A stage whose output is
complete is skipped and a cut SFT or RL run is resumed, so a rerun after Ctrl-C continues
(`fresh: true` starts over). At the end: held-out accuracy per environment before and after RL
(`run_dir/report.json`, `run_dir/heldout_before_after.png`, the table on the console), with the
RL run's own plots in `run_dir/rl/plots/`. Exit status 2 on a config error or a failed stage (one line
`k2post recipe: error: ...`; for a failed stage it names the stage's log).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from k2post.command import UserError, add_config_arguments, command_parser, run_command
from k2post.config.loader import ConfigError
from k2post.config.registry import load_run_config
from k2post.config.runs import RecipeConfig

console = Console(highlight=False, width=max(140, shutil.get_terminal_size((140, 24)).columns))
# Lines of the children's output shown on the console (the log files keep everything).
SHOWN = re.compile(
    r"^(synth:|step \d+/|\{\"completed\"|rl: |model written|report:|\s*\S+\s+\d+\s+\d\.\d{3}|"
    r"[┏┃┡│└]|k2post( \w+)?: error|.*Error)"
)


# Where each stage config keeps the seed the recipe's `seed` sets.
SEED_FIELDS = {"synth": "seed", "sft": "train.seed", "rl": "seed"}


class StageError(UserError, RuntimeError):
    """A stage's command failed; the message names it and its log."""


def stage_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "k2post.cli", *args]


def run_stage(name: str, command: list[str], logs: Path, timings: dict[str, float]) -> None:
    """Run one stage's command; stream the essentials, keep the whole output in logs/<name>.log."""
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{name}.log"
    console.print(f"[bold cyan]> {name}[/]: {' '.join(command[2:])}")
    started = time.perf_counter()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with (
        open(log_path, "w") as log,
        subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, bufsize=1
        ) as proc,
    ):
        for line in proc.stdout:
            log.write(line)
            if SHOWN.match(line):
                console.print(f"  {line.rstrip()}", markup=False)
    timings[name] = round(time.perf_counter() - started, 1)
    if proc.returncode != 0:
        raise StageError(f"stage {name!r} failed (exit {proc.returncode}); see {log_path}")
    console.print(f"  [dim]{name}: {timings[name]:.0f}s[/]")


def env_names(rl_config: str, overrides: list[str]) -> tuple[list[str], list[str]]:
    """The RL config's environments, and those of them that have a `shifted` split."""
    from k2post.envs.registry import make_environment

    entries = load_run_config(rl_config, overrides, expected_kind="rl").envs
    return [e.name for e in entries], [
        e.name for e in entries if has_split(make_environment(e.name, e.config), "shifted")
    ]


def has_split(env: Any, split: str) -> bool:
    """Whether `env.tasks(split)` yields tasks (an environment without the split raises a ValueError)."""
    try:
        return next(iter(env.tasks(split, seed=0, n=1)), None) is not None
    except ValueError:
        return False


class Recipe:
    """The stages of one recipe run, with their chained paths."""

    def __init__(self, cfg: RecipeConfig) -> None:
        self.cfg, self.run_dir = cfg, Path(cfg.run_dir)
        self.model, self.synth, self.sft, self.rl = (
            Path(cfg.model.path.replace("{run_dir}", cfg.run_dir)),
            self.run_dir / "synth",
            self.run_dir / "sft",
            self.run_dir / "rl",
        )
        self.logs, self.timings = self.run_dir / "logs", {}
        self.envs, self.shifted_envs = env_names(cfg.rl, cfg.rl_overrides)

    def stage_model(self) -> None:
        from k2post.models.config import is_model_dir

        if is_model_dir(self.model):
            return
        if self.cfg.model.flavor is None:
            raise ConfigError(f"model.path {str(self.model)!r} is not a model dir and model.flavor is null")
        seed = self.cfg.model.seed if self.cfg.seed is None else self.cfg.seed
        run_stage(
            "model",
            stage_command(
                "model", "init", "--flavor", self.cfg.model.flavor, "--out", str(self.model), "--seed", str(seed)
            ),
            self.logs,
            self.timings,
        )

    def stage_synth(self) -> None:
        if (self.synth / "stats.json").is_file() and (self.synth / "dataset").is_dir():
            return
        run_stage(
            "synth",
            stage_command(
                "synth",
                self.cfg.synth,
                f"out_dir={self.synth}",
                *self.seed_override("synth"),
                *self.cfg.synth_overrides,
            ),
            self.logs,
            self.timings,
        )

    def stage_sft(self) -> None:
        if (self.sft / "final" / "config.json").is_file():
            return
        # a cut SFT stage continues (`--resume`: the run dir's own config, these overrides on top)
        source = ["--resume", str(self.sft)] if (self.sft / "config.yaml").is_file() else [self.cfg.sft]
        run_stage(
            "sft",
            stage_command(
                "sft",
                *source,
                f"run_dir={self.sft}",
                f"model.path={self.model}",
                "model.flavor=null",
                f"data.path={self.synth / 'dataset'}",
                *self.seed_override("sft"),
                *self.cfg.sft_overrides,
            ),
            self.logs,
            self.timings,
        )

    def seed_override(self, kind: str) -> list[str]:
        """The recipe's seed as an override of a stage config of `kind` (before the stage's own overrides, which
        win).
        """
        if self.cfg.seed is None:
            return []
        return [f"{SEED_FIELDS[kind]}={self.cfg.seed}"]

    def eval_stage(self, stage: str, name: str, target: Path, config: Path, envs: list[str], splits: list[str]) -> None:
        """One `k2post eval` process (logged as `stage`) over `envs` for every split of `splits` still missing its
        report (`eval/<name>.json` for test, `eval/<name>_<split>.json` otherwise): one engine build for all."""
        missing = [split for split in splits if not self.eval_report(name, split).is_file()]
        if not missing:
            return
        out = str(self.run_dir / "eval" / f"{name}_{{split}}.json")
        args = [
            "eval",
            str(target),
            *[flag for n in envs for flag in ("--env", n)],
            "--env-config",
            str(config),
            "--n",
            str(self.cfg.eval_n),
            "--seed",
            str(self.cfg.eval_seed),
            *[flag for split in missing for flag in ("--split", split)],
            "--out",
            out,
        ]
        run_stage(stage, stage_command(*args), self.logs, self.timings)
        renamed = self.run_dir / "eval" / f"{name}_test.json"
        if renamed.is_file():
            os.replace(renamed, self.eval_report(name, "test"))

    def eval_report(self, name: str, split: str) -> Path:
        return self.run_dir / "eval" / (f"{name}.json" if split == "test" else f"{name}_{split}.json")

    def evals(self, name: str, target: Path, config: Path) -> dict[str, dict[str, Any]]:
        """The test-split eval of `target` over the RL envs, and the shifted one over those that have a shifted set:
        one eval process when both cover the same envs, else one per split."""
        wanted = {"test": self.envs, "shifted": self.shifted_envs}
        wanted = {split: names for split, names in wanted.items() if names}
        if len({tuple(names) for names in wanted.values()}) == 1:
            self.eval_stage(f"eval_{name}", name, target, config, self.envs, list(wanted))
        else:
            for split, names in wanted.items():
                stage = f"eval_{name}" if split == "test" else f"eval_{name}_{split}"
                self.eval_stage(stage, name, target, config, names, [split])
        return {split: json.loads(self.eval_report(name, split).read_text()) for split in wanted}

    def rl_config_file(self) -> Path:
        """The RL config with the recipe's overrides applied (what `eval before` reads env configs and budgets from)."""
        from k2post.config.loader import dump_yaml

        # PTX (when the RL config turns it on) reads this recipe's own SFT data; an rl_overrides entry still wins
        ptx_data = f"loss.ptx_data={self.synth / 'dataset'}"
        cfg = load_run_config(
            self.cfg.rl,
            [
                *self.seed_override("rl"),
                ptx_data,
                *self.cfg.rl_overrides,
                f"run_dir={self.rl}",
                f"model.path={self.sft / 'final'}",
                "model.flavor=null",
            ],
            expected_kind="rl",
        )
        path = self.run_dir / "rl_config.yaml"
        path.write_text(dump_yaml(cfg))
        return path

    def stage_rl(self, config: Path) -> None:
        if (self.rl / "final" / "config.json").is_file():
            return
        if (self.rl / "config.yaml").is_file():
            run_stage("rl", stage_command("rl", "--resume", str(self.rl)), self.logs, self.timings)
        else:
            run_stage("rl", stage_command("rl", str(config)), self.logs, self.timings)

    def run(self) -> dict[str, Any]:
        if self.cfg.fresh and self.run_dir.exists():
            shutil.rmtree(self.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        self.stage_model()
        self.stage_synth()
        self.stage_sft()
        rl_config = self.rl_config_file()
        before = self.evals("before_rl", self.sft / "final", rl_config)
        self.stage_rl(rl_config)
        after = self.evals("after_rl", self.rl, rl_config)
        return self.report(before, after, time.perf_counter() - started)

    def report(self, before: dict[str, Any], after: dict[str, Any], wall_s: float) -> dict[str, Any]:
        """report.json (test split under "envs", shifted sets under "shifted"), the bar chart and the console tables."""
        sections = {
            split: {
                name: {"before": before[split]["envs"][name], "after": after[split]["envs"][name]}
                for name in before[split]["envs"]
            }
            for split in before
        }
        report = {
            "seed": self.cfg.seed,
            "envs": sections["test"],
            "shifted": sections.get("shifted", {}),
            "mean_accuracy_before": before["test"]["mean_accuracy"],
            "mean_accuracy_after": after["test"]["mean_accuracy"],
            "eval_n": self.cfg.eval_n,
            "eval_seed": self.cfg.eval_seed,
            "stage_seconds": self.timings,
            "wall_s": round(wall_s, 1),
            "rl_plots": sorted(p.name for p in (self.rl / "plots").glob("*.png")),
        }
        rows = sections["test"]
        (self.run_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
        plot_before_after(rows, self.run_dir / "heldout_before_after.png")
        console.print(report_table(report))
        if report["shifted"]:
            console.print(report_table({**report, "envs": report["shifted"]}, "shifted"))
        console.print(
            f"report: {self.run_dir / 'report.json'}  plot: {self.run_dir / 'heldout_before_after.png'}  "
            f"RL curves: {self.rl / 'plots'}/"
        )
        return report


def report_table(report: dict[str, Any], split: str = "test") -> Table:
    """Before/after accuracy per env; the mean row for the test split (the shifted table's mean is its own)."""
    sizes = sorted({pair["before"]["n"] for pair in report["envs"].values()})
    title = (
        f"held-out {split} accuracy before and after RL ({'/'.join(map(str, sizes))} tasks per env, "
        f"recipe seed {report['seed']})"
    )
    table = Table(title=title)
    for column in ("env", "before RL", "after RL", "change", "truncated before", "truncated after"):
        table.add_column(column, justify="left" if column == "env" else "right")
    for name, pair in report["envs"].items():
        b, a = pair["before"], pair["after"]
        table.add_row(
            name,
            f"{b['accuracy']:.3f}",
            f"{a['accuracy']:.3f}",
            f"{a['accuracy'] - b['accuracy']:+.3f}",
            f"{b['truncation_rate']:.2f}",
            f"{a['truncation_rate']:.2f}",
        )
    mean_b = sum(p["before"]["accuracy"] for p in report["envs"].values()) / len(report["envs"])
    mean_a = sum(p["after"]["accuracy"] for p in report["envs"].values()) / len(report["envs"])
    table.add_row("[bold]mean", f"{mean_b:.3f}", f"{mean_a:.3f}", f"[bold]{mean_a - mean_b:+.3f}", "", "")
    return table


def plot_before_after(rows: dict[str, dict[str, dict[str, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rows)
    xs = range(len(names))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(
        [x - 0.2 for x in xs], [rows[n]["before"]["accuracy"] for n in names], width=0.4, label="after SFT (before RL)"
    )
    ax.bar([x + 0.2 for x in xs], [rows[n]["after"]["accuracy"] for n in names], width=0.4, label="after RL")
    ax.set_xticks(list(xs), names)
    ax.set_ylim(0, 1)
    ax.set_ylabel("held-out accuracy")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "recipe", "the recipe end to end: model, synth, SFT, eval, RL, eval, report (what `make demo` runs)"
    )
    add_config_arguments(parser, "recipe", "configs/recipe_demo.yaml")
    return parser


def run(args: argparse.Namespace) -> int:
    """Validate the recipe and every stage config (before any stage runs), then run the stages."""
    cfg = load_run_config(args.file, args.overrides, expected_kind="recipe")
    recipe = Recipe(cfg)
    console.print(
        f"[bold]recipe[/] {args.file} -> {cfg.run_dir}: model, synth, sft, eval, rl ({', '.join(recipe.envs)}), eval"
    )
    recipe.run()
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv, run)


if __name__ == "__main__":
    raise SystemExit(main())
