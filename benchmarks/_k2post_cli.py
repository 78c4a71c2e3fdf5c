"""Run a `k2post` command for a benchmark script, with its whole output in a log file (run the scripts from the repo
root).

    seconds = run_cli(["eval", model, "--n", "8"], log=out / "eval.log")  # a child process
    seconds = run_cli(["eval", model, "--n", "8"], log=out / "eval.log", in_process=True)  # --smoke runs

A full benchmark runs every command in a child process, as a user would. `in_process=True` (the scripts' `--smoke`,
the test suite's check that every step runs) runs the commands that hold no process-wide state (`config`, `model`,
`synth`, `eval`, `critic`) through `k2post.cli.main` in this process instead: the same command line and code,
without the 10-20 s of imports and interpreter teardown that are most of a smoke-sized step (also `rephrase`,
`judge`). `sft`
(torch.distributed) and `rl` (Ray) always get a child process, whose environment is the benchmark's own (what an
in-process vLLM engine set, `VLLM_*`, is undone after each command). A failure stops the benchmark with the log's
tail.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IN_PROCESS_COMMANDS = frozenset({"config", "model", "synth", "eval", "critic", "rephrase", "judge"})


def run_cli(args: Sequence[str], log: Path, in_process: bool = False) -> float:
    """Run `k2post ARGS` from the repo root, output to `log`; its seconds. SystemExit with the log's tail on failure."""
    started = time.perf_counter()
    if in_process and args[0] in IN_PROCESS_COMMANDS:
        status = _in_this_process(list(args), log)
    else:
        with open(log, "w") as handle:
            command = [sys.executable, "-m", "k2post.cli", *args]
            status = subprocess.run(command, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT).returncode
    if status != 0:
        raise SystemExit(f"k2post {args[0]} failed (exit {status}):\n{log.read_text()[-3000:]}")
    return time.perf_counter() - started


def _in_this_process(args: list[str], log: Path) -> int:
    """`k2post.cli.main(args)` with its output in `log` (sys.stdout / sys.stderr, and file descriptors 1 and 2 for
    native output), the working directory at the repo root, and the environment restored afterwards."""
    from k2post.cli import main

    environ = dict(os.environ)
    sys.stdout.flush(), sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    try:
        with (
            open(log, "w", buffering=1) as handle,
            contextlib.chdir(ROOT),
            contextlib.redirect_stdout(handle),
            contextlib.redirect_stderr(handle),
        ):
            os.dup2(handle.fileno(), 1), os.dup2(handle.fileno(), 2)
            try:
                return main(args)
            except Exception:  # a crash is the child's traceback in its log, as in a child process
                traceback.print_exc()
                return 1
    finally:
        os.dup2(saved[0], 1), os.dup2(saved[1], 2)
        os.close(saved[0]), os.close(saved[1])
        os.environ.clear()
        os.environ.update(environ)
