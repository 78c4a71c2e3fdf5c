"""Assert-test harness that runs *inside* the sandbox as main.py (stdlib only, never imported
by the trainer).

Inputs in the sandbox work dir: `solution.py` (the candidate code) and `tests.json`
(`{"tests": [assert statements...], "timeout_s": per-step seconds}`); the first stdin line is
a nonce. The solution is executed as module `solution` (so `if __name__ == "__main__":`
blocks do not run), then each test in the same namespace, each under a SIGALRM timer. The
program's own stdout/stderr go to /dev/null; results go to the original stdout, one line per
step, each prefixed by the nonce and written as soon as it is known (a later hang or crash
keeps the earlier results):

    <nonce> {"step": "load", "ok": true, "error": null}
    <nonce> {"step": 0, "ok": false, "error": "AssertionError: "}
    <nonce> {"step": "done"}

The harness shares a process with the candidate code, so a deliberately hostile solution can
forge lines once it finds the nonce; the nonce stops accidental or printed forgeries.
"""

import json
import os
import signal
import sys

MAX_ERROR_CHARS = 300


class StepTimeout(BaseException):
    """Raised by SIGALRM when a step runs past its time."""


def _on_alarm(signum, frame):
    raise StepTimeout()


def _timed_exec(source, filename, namespace, timeout_s):
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        exec(compile(source, filename, "exec"), namespace)
        return True, None
    except StepTimeout:
        raise
    except BaseException as err:  # noqa: BLE001  (SystemExit, KeyboardInterrupt: a failed step)
        return False, f"{type(err).__name__}: {err}"[:MAX_ERROR_CHARS]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def run_step(source, filename, namespace, timeout_s):
    """Execute `source` in `namespace` under a timer; (ok, error text or None)."""
    try:
        return _timed_exec(source, filename, namespace, timeout_s)
    except StepTimeout:  # also when the timer fires while it is being cancelled
        return False, f"timeout after {timeout_s}s"


def make_emitter(nonce):
    """Keep a private copy of stdout, silence fds 1 and 2, return the result writer."""
    out = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)

    def emit(record):
        os.write(out, (nonce + " " + json.dumps(record) + "\n").encode())

    return emit


def main():
    nonce = sys.stdin.readline().strip()
    with open("tests.json", encoding="utf-8") as fh:
        spec = json.load(fh)
    with open("solution.py", encoding="utf-8", errors="replace") as fh:
        solution = fh.read()
    emit = make_emitter(nonce)
    signal.signal(signal.SIGALRM, _on_alarm)
    timeout_s = float(spec.get("timeout_s", 2.0))
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    ok, error = run_step(solution, "solution.py", namespace, timeout_s)
    emit({"step": "load", "ok": ok, "error": error})
    if ok:
        for index, test in enumerate(spec["tests"]):
            ok_i, error_i = run_step(test, f"<test {index}>", namespace, timeout_s)
            emit({"step": index, "ok": ok_i, "error": error_i})
    emit({"step": "done"})
    os._exit(0)  # skip the solution's atexit hooks and non-daemon threads


if __name__ == "__main__":
    main()
