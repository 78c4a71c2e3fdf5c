"""Benchmark: the adversarial suite on every built-in gym: the best cheap strategy against honest answers.

Run: `python benchmarks/reward_hacks.py [--tasks 8] [--split test] [--gyms math code] [--tables] [--smoke]`

For each built-in gym (environments/), the suite (k2post/envs/adversary.py) scores the gym's honest-right and
honest-wrong answers and every cheap strategy (empty, filler, copies of the prompt or its context, hedges, format
only, verdict spam, injected turns, forced errors, no / all / repeated tool calls, the gym's own hacks) on the
first `--tasks` tasks of `--split`. Prints one row per gym (verdict, best hack, its mean, honest-wrong, honest-right,
margin = best hack - the bar: honest-wrong's mean, or chance for a choice gym; `--tables` adds each gym's full
table), then exactly one JSON line:
{"gyms": N, "gyms_hackable": N, "gyms_not_judged": N, "worst_margin": X, "worst": "gym/strategy", "per_gym": {...}}
A gym is hackable when it fails the suite; one without `honest()` answers is not judged.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's `environments` package

from rich.console import Console  # noqa: E402

from k2post.envs.adversary import GymReport, run_suite, suite_summary  # noqa: E402
from k2post.envs.registry import BUILTIN_PACKAGE, make_environment, registered_environments  # noqa: E402
from k2post.envs.report import adversary_table, suite_table  # noqa: E402


def builtin_gyms() -> list[str]:
    """Names of the registered built-in gyms (the repository's environments/ package)."""
    envs = registered_environments()
    return sorted(name for name, cls in envs.items() if cls.__module__.startswith(BUILTIN_PACKAGE + "."))


def run(names: list[str], tasks: int, split: str) -> tuple[list[GymReport], dict[str, float]]:
    """The suite's report per gym, and the seconds each took."""
    reports, seconds = [], {}
    for name in names:
        start = time.perf_counter()
        reports.append(run_suite(make_environment(name), n_tasks=tasks, split=split))
        seconds[name] = round(time.perf_counter() - start, 2)
    return reports, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=8, help="tasks per gym (default 8)")
    parser.add_argument("--split", default="test", help="split the tasks come from (default test)")
    parser.add_argument("--gyms", nargs="*", default=None, help="built-in gyms to run (default: all)")
    parser.add_argument("--tables", action="store_true", help="print each gym's full table too")
    parser.add_argument("--smoke", action="store_true", help="2 tasks per gym (a check that the script runs)")
    args = parser.parse_args()
    names = args.gyms or builtin_gyms()
    reports, seconds = run(names, 2 if args.smoke else args.tasks, args.split)
    console = Console(width=max(shutil.get_terminal_size((160, 24)).columns, 120), highlight=False)
    if args.tables:
        for report in reports:
            console.print(adversary_table(report) if report.judged else f"{report.env}: not judged")
    console.print(suite_table(reports))
    summary = suite_summary(reports)
    summary["seconds"] = seconds
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
