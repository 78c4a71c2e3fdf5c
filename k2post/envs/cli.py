"""`k2post envs ...`: list the registered environments and run their golden reward tests.

    k2post envs list
    k2post envs test                          # every env that has a golden file
    k2post envs test math code --isolated     # through the RewardPool (processes, timeouts)
    k2post envs test --isolated --workers 4 --timeout 10
    k2post envs test my_env --golden path/to/my_env.jsonl

`test` prints a table per environment (pass/fail, got, expected, diff, error) and a summary;
it exits 1 when a case fails and 2 (one-line error) for an unknown env or a bad golden file.
"""

from __future__ import annotations

import argparse
import shutil
from importlib.metadata import entry_points
from pathlib import Path

from rich.console import Console
from rich.table import Table

from k2post.envs.base import Environment
from k2post.envs.golden import CaseResult, GoldenFileError, default_golden_path, run_golden
from k2post.envs.registry import ENTRY_POINT_GROUP, get_environment, registered_environments
from k2post.envs.workers import RewardPool


def _console() -> Console:
    """Rich console; wide enough for the tables when stdout is not a terminal."""
    width = shutil.get_terminal_size((160, 24)).columns
    return Console(width=max(width, 120), highlight=False)


def environment_source(cls: type[Environment]) -> str:
    """'builtin', 'entry point (dist)' or the defining module."""
    if cls.__module__.split(".")[0] == "environments":
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


def _cmd_list(args: argparse.Namespace) -> int:
    table = Table(title="Registered environments")
    for column in ("name", "task type", "turns", "reward range", "tools", "source"):
        table.add_column(column)
    for name, cls in registered_environments().items():
        low, high = cls.reward_range
        turns = f"multi (≤{getattr(cls, 'max_turns', '?')})" if cls.multi_turn else "single"
        table.add_row(name, cls.task_type, turns, f"[{low:g}, {high:g}]", _tool_count(cls), environment_source(cls))
    _console().print(table)
    return 0


def _targets(args: argparse.Namespace) -> list[tuple[str, Path]]:
    """(env name, golden path) pairs to run; explicit names must have a golden file."""
    if args.golden is not None:
        if len(args.names) != 1:
            raise ValueError("--golden needs exactly one environment NAME")
        get_environment(args.names[0])
        return [(args.names[0], Path(args.golden))]
    if args.names:
        pairs = [(name, default_golden_path(name)) for name in args.names]
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


def _cmd_test(args: argparse.Namespace) -> int:
    console = _console()
    targets = _targets(args)
    if not targets:
        console.print("no golden files found (built-ins: environments/golden/<name>.jsonl)")
        return 0
    pool = RewardPool(num_workers=args.workers, timeout_s=args.timeout) if args.isolated else None
    total = failed = 0
    try:
        for name, path in targets:
            results = run_golden(name, path, pool=pool)
            console.print(results_table(name, path, results))
            total += len(results)
            failed += sum(not r.passed for r in results)
    finally:
        if pool is not None:
            pool.close()
    verdict = "[red]FAILED[/red]" if failed else "[green]OK[/green]"
    counts = f"{total} cases in {len(targets)} environment(s), {total - failed} passed, {failed} failed"
    console.print(f"{verdict}: {counts}")
    return 1 if failed else 0


def add_envs_parser(sub: argparse._SubParsersAction) -> None:
    """Register `k2post envs list|test`."""
    envs = sub.add_parser("envs", help="list environments, run golden reward tests")
    cmds = envs.add_subparsers(dest="envs_cmd", required=True)
    cmds.add_parser("list", help="registered environments (built-ins and entry points)").set_defaults(func=_cmd_list)
    test = cmds.add_parser("test", help="run golden-file reward regression tests")
    test.add_argument("names", nargs="*", metavar="NAME", help="environments (default: all with a golden file)")
    test.add_argument("--golden", default=None, metavar="PATH", help="a golden JSONL file (with exactly one NAME)")
    test.add_argument("--isolated", action="store_true", help="score in worker processes (RewardPool) with timeouts")
    test.add_argument("--workers", type=int, default=2, help="RewardPool workers with --isolated (default 2)")
    test.add_argument("--timeout", type=float, default=30.0, help="seconds per scoring call with --isolated (default 30)")
    test.set_defaults(func=_cmd_test)
