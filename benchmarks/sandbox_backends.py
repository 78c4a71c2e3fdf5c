"""Benchmark: cost of one sandboxed Python run — k2post's launcher vs bubblewrap vs no isolation.

Run: `python benchmarks/sandbox_backends.py [--runs 30]`

Each backend runs `python -I -S -c <tiny program>` `--runs` times (after one warm-up) and the median wall
time is reported:
- `k2post`: `k2post.sandbox.Sandbox.run_python` — a fresh uid, rlimits, mount/pid/ipc/uts/net namespaces,
  a read-only chroot on a capped tmpfs, seccomp, capped output, uid sweep (docs/SANDBOX.md);
- `bwrap`: bubblewrap (the Debian package; skipped when `bwrap` is not on PATH) with the closest flags it has
  on its own — `--unshare-all --die-with-parent --new-session --cap-drop ALL`, read-only binds of the
  system dirs and the interpreter prefix, a tmpfs `/tmp` — and none of what it lacks (no uid drop when
  started as root, no rlimits, no seccomp filter unless one is compiled and passed in, no output cap);
- `plain`: `subprocess.run` of the same interpreter, no isolation (the floor).

Prints a table, then exactly one JSON line:
{"k2post_ms": .., "bwrap_ms": .. or null, "plain_ms": .., "k2post_over_bwrap": .. or null, "runs": ..}
Ratios only mean something within one run: these machines are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._timing import wall_times  # noqa: E402
from k2post.sandbox import Sandbox, SandboxConfig  # noqa: E402

PROGRAM = "import os; print(len(os.listdir('/')))"


def _python() -> str:
    return os.path.realpath(sys.executable)


def bwrap_argv() -> list[str] | None:
    """The bubblewrap command for PROGRAM, or None without bwrap."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return None
    binds = [d for d in ("/usr", "/bin", "/lib", "/lib64", "/sbin") if os.path.exists(d)]
    argv = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    for path in [*binds, sys.base_prefix]:
        argv += ["--ro-bind", path, path]
    argv += ["--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev", "--chdir", "/tmp"]
    return [*argv, _python(), "-I", "-S", "-c", PROGRAM]


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed: {done.stderr.decode(errors='replace')[-500:]}")


def median_ms(fn, runs: int) -> float:
    return 1000 * statistics.median(wall_times(fn, runs))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="timed runs per backend (median reported)")
    args = parser.parse_args()
    sandbox = Sandbox(SandboxConfig(cpu_s=5, wall_s=10))
    results = {"k2post": median_ms(lambda: sandbox.run_python(PROGRAM), args.runs)}
    argv = bwrap_argv()
    results["bwrap"] = median_ms(lambda: _run(argv), args.runs) if argv else None
    results["plain"] = median_ms(lambda: _run([_python(), "-I", "-S", "-c", PROGRAM]), args.runs)
    print(f"{'backend':<8} {'median ms per run':>18}")
    for name, value in results.items():
        print(f"{name:<8} {'not installed' if value is None else f'{value:.1f}':>18}")
    ratio = results["k2post"] / results["bwrap"] if results["bwrap"] else None
    figures = {f"{name}_ms": None if v is None else round(v, 2) for name, v in results.items()}
    print(json.dumps({**figures, "k2post_over_bwrap": None if ratio is None else round(ratio, 2), "runs": args.runs}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
