"""What `k2post envs` shows: the table of registered environments, golden-test targets and result tables.

    console.print(environments_table())
    for name, path in golden_targets(["math"], golden=None):
        console.print(results_table(name, path, run_golden(name, path)))

The command (its flags, exit codes) is pipelines/envs.py; the golden-file format is k2post/envs/golden.py.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path

from rich.table import Table

from k2post.envs.base import Environment
from k2post.envs.golden import CaseResult, GoldenFileError, default_golden_path
from k2post.envs.registry import BUILTIN_PACKAGE, ENTRY_POINT_GROUP, get_environment, registered_environments


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


def golden_targets(names: list[str], golden: str | None) -> list[tuple[str, Path]]:
    """(env name, golden path) pairs: NAME + --golden, the named envs (each needs a golden file), or all with one."""
    if golden is not None:
        if len(names) != 1:
            raise ValueError("--golden needs exactly one environment NAME")
        get_environment(names[0])
        return [(names[0], Path(golden))]
    if names:
        pairs = [(name, default_golden_path(name)) for name in names]
        for name, path in pairs:
            if not path.is_file():
                raise GoldenFileError(f"{path}: no golden file for {name!r} (pass --golden PATH)")
        return pairs
    pairs = [(name, default_golden_path(name)) for name in registered_environments()]
    return [(name, path) for name, path in pairs if path.is_file()]


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.6g}"


def results_table(name: str, path: Path, results: list[CaseResult]) -> Table:
    """One row per case: id, PASS/FAIL, got, expected, diff, what went wrong."""
    table = Table(title=f"{name}  ({path})", title_justify="left")
    for column in ("case", "status", "got", "expected", "diff", "detail / error"):
        table.add_column(column, overflow="fold")
    for r in results:
        status = "[green]PASS[/green]" if r.passed else "[red]FAIL[/red]"
        detail = "; ".join(part for part in (r.detail, r.error or "") if part)
        table.add_row(r.id, status, _fmt(r.got), _fmt(r.expected), _fmt(r.diff), detail)
    return table
