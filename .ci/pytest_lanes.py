"""The test suite as two pytest processes side by side, one per core (what `make test` runs).

    python .ci/pytest_lanes.py [PYTEST_ARGS...]       # both lanes; exit status 0 only if both pass
    K2POST_TEST_LANES=1 python .ci/pytest_lanes.py    # one plain pytest over everything (the same tests)

Most of the suite's wall time is single-core: process start-ups, imports, Ray and vLLM set-up, tiny-model
steps. One pytest process keeps one of the two cores of a CI box idle about half the time, so the suite
runs as two lanes that split the test files between them (no test runs twice, none is left out):

- `e2e`: the end-to-end tests (tests/pipelines, tests/benchmarks) and the 200-call long-episode test (its own
  model and engine; no sandbox, no wall-clock bound): child processes with long deadlines, run at a lower CPU
  priority (`nice`) so the unit lane's bounded-time checks keep their core;
- `units`: everything else, including every sandbox test (they count the sandbox uids' processes, so no
  other lane may run sandboxed code) and every test with a wall-clock bound.

Each lane has its own pytest `--basetemp`; its output goes to `<basetemp>.log`, printed in full when it
ends (the e2e lane's log last), with its slowest tests (`--durations=30`, pyproject.toml).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
E2E_PATHS = ["tests/pipelines", "tests/benchmarks", "tests/k2post/rollout/test_long_episode.py"]
E2E_NICENESS = 10


def lane_commands(args: list[str], base: Path) -> dict[str, list[str]]:
    """The pytest command of each lane: e2e takes E2E_PATHS, units the rest of tests/ (the same args)."""
    pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
    return {
        "units": [*pytest, "tests", *[f"--ignore={p}" for p in E2E_PATHS], f"--basetemp={base / 'units'}", *args],
        "e2e": ["nice", "-n", str(E2E_NICENESS), *pytest, *E2E_PATHS, f"--basetemp={base / 'e2e'}", *args],
    }


def run_lanes(commands: dict[str, list[str]], base: Path) -> dict[str, tuple[int, float]]:
    """Start every lane, wait for all; (exit status, seconds) per lane. Ctrl-C / SIGTERM end every lane."""
    started, procs, logs, done = time.monotonic(), {}, {}, {}
    for name, command in commands.items():
        logs[name] = open(base / f"{name}.log", "w")
        procs[name] = subprocess.Popen(command, cwd=ROOT, stdout=logs[name], stderr=subprocess.STDOUT)
        print(f"[lanes] {name}: {' '.join(command)}", flush=True)
    try:
        while len(done) < len(procs):
            for name, proc in procs.items():
                if name not in done and proc.poll() is not None:
                    done[name] = (proc.returncode, time.monotonic() - started)
                    print(f"[lanes] {name} finished: exit {proc.returncode} after {done[name][1]:.0f}s", flush=True)
            time.sleep(1.0)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                proc.wait()
        for log in logs.values():
            log.close()
    return done


def names_tests(argv: list[str]) -> bool:
    """Whether the args name test paths or ids themselves (then one plain pytest runs just those)."""
    return any(arg.startswith("tests") or "::" in arg for arg in argv)


def main(argv: list[str]) -> int:
    if os.environ.get("K2POST_TEST_LANES", "2") == "1" or names_tests(argv):
        return subprocess.call([sys.executable, "-m", "pytest", *argv], cwd=ROOT)
    base = Path(tempfile.mkdtemp(prefix="k2post-lanes-"))
    try:
        done = run_lanes(lane_commands(argv, base), base)
    except KeyboardInterrupt:
        return 130
    for name in ("units", "e2e"):
        print(f"\n{'=' * 30} lane {name} {'=' * 30}", flush=True)
        sys.stdout.write((base / f"{name}.log").read_text(errors="replace"))
    for name, (code, seconds) in done.items():
        print(f"[lanes] {name}: exit {code}, {seconds:.0f}s", flush=True)
    # pytest exit 5 = no tests collected (a -k or -m that selects nothing in one lane): not a failure
    worst = max((0 if code == 5 else code) for code, _ in done.values())
    if worst == 0:
        shutil.rmtree(base, ignore_errors=True)  # kept on failure: the lanes' tmp_path dirs and logs
    else:
        print(f"[lanes] logs and tmp dirs kept in {base}", flush=True)
    return worst


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
