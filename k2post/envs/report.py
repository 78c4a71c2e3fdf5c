"""What `k2post envs` shows: the table of registered environments, golden-test targets and result tables, and the
adversarial suite's tables (per gym, and one row per gym).

    console.print(environments_table())
    for name, path in golden_targets(["math"], golden=None):
        console.print(results_table(name, path, run_golden(name, path)))
    console.print(adversary_table(run_suite(make_environment("math"))))

The command (its flags, exit codes) is pipelines/envs.py; the golden-file format is k2post/envs/golden.py; the
suite is k2post/envs/adversary.py.
"""

from __future__ import annotations

import math
from importlib.metadata import entry_points
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from k2post.envs.adversary import GymReport, StrategyResult, strategy_failures
from k2post.envs.base import Environment
from k2post.envs.golden import CaseResult, GoldenFileError, default_golden_path
from k2post.envs.registry import (
    BUILTIN_PACKAGE,
    ENTRY_POINT_GROUP,
    get_environment,
    registered_environments,
    resolve_name,
)


def environment_source(cls: type[Environment]) -> str:
    """'builtin', 'entry point (dist)' or the defining module."""
    if cls.__module__.split(".")[0] == BUILTIN_PACKAGE:
        return "builtin"
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == cls.name:
            dist = getattr(ep, "dist", None)
            return f"entry point ({dist.name})" if dist is not None else "entry point"
    return cls.__module__


def _tool_count(cls: type[Environment]) -> str:
    try:
        return str(len(cls().tools()))
    except Exception:  # listing must not fail on an env that needs a config to build
        return "?"


def environments_table() -> Table:
    """One row per registered environment: name, task type, turns, reward range, tools, source."""
    table = Table(title="Registered environments")
    for column in ("name", "task type", "turns", "reward range", "tools", "source"):
        table.add_column(column)
    for name, cls in registered_environments().items():
        low, high = cls.reward_range
        turns = f"multi (≤{getattr(cls, 'max_turns', '?')})" if cls.multi_turn else "single"
        table.add_row(name, cls.task_type, turns, f"[{low:g}, {high:g}]", _tool_count(cls), environment_source(cls))
    return table


def golden_targets(names: list[str], golden: str | None, missing_ok: bool = False) -> list[tuple[str, Path]]:
    """(env name, golden path) pairs: NAME + --golden, the named envs (each needs a golden file unless
    `missing_ok`: then those without one are left out), or all with one."""
    if golden is not None:
        if len(names) != 1:
            raise ValueError("--golden needs exactly one environment NAME")
        get_environment(names[0])
        return [(names[0], Path(golden))]
    if names:
        pairs = [(name, default_golden_path(resolve_name(name)[0])) for name in names]
        for name, path in pairs:
            if not path.is_file() and not missing_ok:
                raise GoldenFileError(f"{path}: no golden file for {name!r} (pass --golden PATH)")
        return [(name, path) for name, path in pairs if path.is_file()]
    pairs = [(name, default_golden_path(name)) for name in registered_environments()]
    return [(name, path) for name, path in pairs if path.is_file()]


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.6g}"


def results_table(name: str, path: Path, results: list[CaseResult]) -> Table:
    """One row per case: id, PASS/FAIL, got, expected, diff, what went wrong (error texts carry model output:
    shown as text, never as rich markup)."""
    table = Table(title=f"{name}  ({path})", title_justify="left")
    for column in ("case", "status", "got", "expected", "diff", "detail / error"):
        table.add_column(column, overflow="fold")
    for r in results:
        status = "[green]PASS[/green]" if r.passed else "[red]FAIL[/red]"
        detail = "; ".join(part for part in (r.detail, r.error or "") if part)
        table.add_row(escape(r.id), status, _fmt(r.got), _fmt(r.expected), _fmt(r.diff), escape(detail))
    return table


def _score(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.3f}"


def _strategy_row(result: StrategyResult, margin: str, status: str) -> list[str]:
    count = len(result.values)
    above = f"{result.above_right}/{count}" if count else "—"
    errors = f"{len(result.errors)}: {escape(result.errors[0])}" if result.errors else "0"
    return [escape(result.name), _score(result.mean), _score(result.max), above, errors, margin, status]


def adversary_table(report: GymReport) -> Table:
    """The suite's table for one gym: honest-right, honest-wrong, then every strategy, best-paying first, with
    mean, max, tasks above honest-right, errors, margin over the bar (honest-wrong's mean, or chance) and PASS/FAIL
    per row."""
    bar, value = report.bar
    title = (
        f"{escape(report.env)}  adversarial suite ({report.split}, {report.tasks} tasks): {report.verdict}"
        f"  (bar: {bar} {_score(value)})"
    )
    table = Table(title=title, title_justify="left")
    for column in ("strategy", "mean", "max", "> right", "errors", "margin", "status"):
        table.add_column(column, overflow="fold")
    for result in (report.right, report.wrong):
        table.add_row(*_strategy_row(result, "", "[red]ERROR[/red]" if result.errors else "honest"))
    for result in sorted(report.strategies.values(), key=lambda r: -report.margin(r.name)):
        failed = strategy_failures(result, report.bar_for(result), len(result.values))
        status = "[red]FAIL[/red]" if failed else "[green]PASS[/green]"
        table.add_row(*_strategy_row(result, f"{report.margin(result.name):+.3f}", status))
    return table


def suite_table(reports: list[GymReport]) -> Table:
    """One row per gym: verdict, its best-paying strategy's mean against honest-wrong (and chance, where that is the
    bar) and honest-right."""
    table = Table(title="Reward hacks: the best cheap strategy per gym against honest answers", title_justify="left")
    for column in ("gym", "verdict", "best hack", "hack", "honest wrong", "honest right", "margin", "tasks"):
        table.add_column(column)
    for report in reports:
        worst = report.worst() if report.judged else None
        if worst is None:
            table.add_row(escape(report.env), report.verdict, "—", "—", "—", "—", "—", str(report.tasks))
            continue
        name, margin = worst
        hack = report.strategies[name].mean
        wrong = _score(report.wrong.mean) + (f" (chance {report.chance:.3f})" if report.bar[0] == "chance" else "")
        cells = [_score(hack), wrong, _score(report.right.mean), f"{margin:+.3f}"]
        table.add_row(escape(report.env), _verdict_markup(report), escape(name), *cells, str(report.tasks))
    return table


def _verdict_markup(report: GymReport) -> str:
    colour = "green" if report.passed else "red"
    return f"[{colour}]{report.verdict}[/{colour}]"
