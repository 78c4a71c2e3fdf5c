"""`k2post envs ...`: list the registered environments, run their golden reward tests and the adversarial suite.

    k2post envs list
    k2post envs test                          # every env's golden file, then the suite on every env
    k2post envs test math code --isolated     # through the RewardPool (processes, timeouts)
    k2post envs test --isolated --workers 4 --timeout 10
    k2post envs test my_env --golden path/to/my_env.jsonl
    k2post envs test my_pkg.envs:MyEnv --hack-tasks 16   # a third-party gym: its golden file, then the suite
    k2post envs test --no-hacks                      # golden files only
    python -m k2post_pipelines.envs list             # the same without the console script

`test` prints a table per environment (pass/fail, got, expected, diff, error) and a summary; then it runs the
adversarial suite (k2post/envs/adversary.py) on each named env (default: every registered one) and prints its
table. A named env without a golden file gets the suite only (with --no-hacks that is an error). It exits 1 when
a golden case or a gym fails, and 2 (one line `k2post envs: error: ...`) for an unknown env or a bad golden file.
The tables: k2post/envs/report.py.
"""

from __future__ import annotations

import argparse
import shutil
from typing import Any

from rich.console import Console
from rich.markup import escape

from k2post.command import command_parser, run_command
from k2post.envs.splits import SPLITS


def _console() -> Console:
    """Rich console; wide enough for the tables when stdout is not a terminal."""
    width = shutil.get_terminal_size((160, 24)).columns
    return Console(width=max(width, 120), highlight=False)


def _list(args: argparse.Namespace) -> int:
    from k2post.envs.report import environments_table

    _console().print(environments_table())
    return 0


def _test(args: argparse.Namespace) -> int:
    console = _console()
    golden_failed = _golden(args, console)
    suite_failed = 0 if args.no_hacks else _suite(args, console)
    return 1 if golden_failed or suite_failed else 0


def _golden(args: argparse.Namespace, console: Console) -> int:
    """Run the golden files; the number of failed cases."""
    from k2post.envs.golden import run_golden
    from k2post.envs.report import golden_targets, results_table
    from k2post.envs.workers import RewardPool

    targets = golden_targets(args.names, args.golden, missing_ok=not args.no_hacks)
    for name in sorted(set(args.names) - {name for name, _ in targets}):
        console.print(f"{escape(name)}: no golden file (pass --golden PATH): only the adversarial suite runs")
    if not targets:
        if not args.names:
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
    return failed


def _suite(args: argparse.Namespace, console: Console) -> int:
    """Run the adversarial suite on the named envs (default: every registered one); the number of failed gyms."""
    from k2post.envs.registry import registered_environments, resolve_name

    names = [resolve_name(name)[0] for name in args.names] or list(registered_environments())
    counts = {"PASS": 0, "FAIL": 0, "not judged": 0}
    for name in names:
        counts[_suite_one(name, args, console)] += 1
    colour = "red" if counts["FAIL"] else "green"
    console.print(
        f"[{colour}]adversarial suite[/{colour}]: {len(names)} environment(s), {counts['PASS']} passed, "
        f"{counts['FAIL']} failed, {counts['not judged']} not judged"
    )
    return counts["FAIL"]


def _suite_one(name: str, args: argparse.Namespace, console: Console) -> str:
    """Run the suite on one env and print its table (or why it is not judged); its verdict."""
    from k2post.envs.adversary import run_suite
    from k2post.envs.registry import make_environment
    from k2post.envs.report import adversary_table
    from k2post.envs.workers import error_text

    try:
        env = make_environment(name)
    except Exception as err:  # one unbuildable plug-in must not stop the others
        console.print(
            f"{escape(name)}: not judged (cannot build it with its default config: {escape(error_text(err))})"
        )
        return "not judged"
    split = _suite_split(env, args.split, console)
    report = run_suite(env, n_tasks=args.hack_tasks, split=split)
    if not report.judged:
        console.print(f"{escape(name)}: not judged ({escape(report.not_judged)})")
        return report.verdict
    console.print(adversary_table(report))
    for line in report.gym_failures():
        console.print(f"  [red]FAIL[/red] {escape(name)}: {escape(line)}")
    return report.verdict


def _suite_split(env: Any, split: str, console: Console) -> str:
    """`split`, or train (said in one line) when the env has no such split."""
    try:
        next(iter(env.tasks(split, seed=0, n=1)), None)
    except ValueError:
        console.print(f"{escape(env.name)}: no {escape(repr(split))} split; the adversarial suite uses 'train'")
        return "train"
    return split


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("envs", "list environments, run golden reward tests and the adversarial suite")
    cmds = parser.add_subparsers(dest="envs_cmd", required=True)
    cmds.add_parser("list", help="registered environments (built-ins and entry points)").set_defaults(func=_list)
    test = cmds.add_parser("test", help="run golden-file reward regression tests, then the adversarial suite")
    test.add_argument(
        "names", nargs="*", default=[], metavar="NAME", help="environments (default: all with a golden file)"
    )
    test.add_argument("--golden", default=None, metavar="PATH", help="a golden JSONL file (with exactly one NAME)")
    test.add_argument("--isolated", action="store_true", help="score in worker processes (RewardPool) with timeouts")
    test.add_argument("--workers", type=int, default=2, help="RewardPool workers with --isolated (default 2)")
    test.add_argument(
        "--timeout", type=float, default=30.0, help="seconds per scoring call with --isolated (default 30)"
    )
    test.add_argument("--no-hacks", action="store_true", help="skip the adversarial suite (golden files only)")
    test.add_argument(
        "--hack-tasks",
        type=_positive_int,
        default=8,
        metavar="N",
        help="tasks per env in the adversarial suite (default 8)",
    )
    test.add_argument(
        "--split",
        default="test",
        choices=SPLITS,
        help="split the adversarial suite draws tasks from (default test; train where the env lacks it)",
    )
    test.set_defaults(func=_test)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv, lambda args: args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
