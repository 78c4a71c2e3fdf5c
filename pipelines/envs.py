"""`k2post envs ...`: list the registered environments and run their golden reward tests.

    k2post envs list
    k2post envs test                          # every env that has a golden file
    k2post envs test math code --isolated     # through the RewardPool (processes, timeouts)
    k2post envs test --isolated --workers 4 --timeout 10
    k2post envs test my_env --golden path/to/my_env.jsonl
    python -m k2post_pipelines.envs list             # the same without the console script

`test` prints a table per environment (pass/fail, got, expected, diff, error) and a summary; it exits
1 when a case fails and 2 (one line `k2post envs: error: ...`) for an unknown env or a bad golden file.
The tables: k2post/envs/report.py.
"""

from __future__ import annotations

import argparse
import shutil

from rich.console import Console

from k2post.command import command_parser, run_command


def _console() -> Console:
    """Rich console; wide enough for the tables when stdout is not a terminal."""
    width = shutil.get_terminal_size((160, 24)).columns
    return Console(width=max(width, 120), highlight=False)


def _list(args: argparse.Namespace) -> int:
    from k2post.envs.report import environments_table

    _console().print(environments_table())
    return 0


def _test(args: argparse.Namespace) -> int:
    from k2post.envs.golden import run_golden
    from k2post.envs.report import golden_targets, results_table
    from k2post.envs.workers import RewardPool

    console = _console()
    targets = golden_targets(args.names, args.golden)
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
    console.print(
        f"{verdict}: {total} cases in {len(targets)} environment(s), {total - failed} passed, {failed} failed"
    )
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("envs", "list environments, run golden reward tests")
    cmds = parser.add_subparsers(dest="envs_cmd", required=True)
    cmds.add_parser("list", help="registered environments (built-ins and entry points)").set_defaults(func=_list)
    test = cmds.add_parser("test", help="run golden-file reward regression tests")
    test.add_argument(
        "names", nargs="*", default=[], metavar="NAME", help="environments (default: all with a golden file)"
    )
    test.add_argument("--golden", default=None, metavar="PATH", help="a golden JSONL file (with exactly one NAME)")
    test.add_argument("--isolated", action="store_true", help="score in worker processes (RewardPool) with timeouts")
    test.add_argument("--workers", type=int, default=2, help="RewardPool workers with --isolated (default 2)")
    test.add_argument(
        "--timeout", type=float, default=30.0, help="seconds per scoring call with --isolated (default 30)"
    )
    test.set_defaults(func=_test)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv, lambda args: args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
