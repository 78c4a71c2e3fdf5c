"""Probe harness that runs *inside* the sandbox as main.py (stdlib only, never imported by the trainer).

It computes values, never verdicts. Inputs in the sandbox work dir: `solution.py` (the candidate code)
and `tests.json` (`{"tests": [[probe source or null, ...] per test], "modules": [stdlib names],
"timeout_s": seconds per step}`, the candidate-side expressions of each assert test, split off by
`k2post.sandbox.trusted_asserts`, null where another run computes the value; the expected values stay in
the trusted process); the first stdin line is a nonce. The code gym also runs this harness with an empty
solution to compute a task's *clean* probes (expected sides that call builtins, `list(range(3))`) where
no candidate code exists; `modules` are imported into the namespace first. A `start` record is written
before the solution is read: a run without it never reached the candidate (the sandbox failed). The solution is executed
as module `solution` (so `if __name__ == "__main__":` blocks do not run), then each test's probes are
evaluated in its namespace under a SIGALRM timer and their values written as tagged plain data
(builtin types only, by exact type: `["i", "3"]`, `["l", [...]]`; anything else fails the test). The
program's own stdout/stderr go to /dev/null; records go to the original stdout, one line per step, each
prefixed by the nonce and written as soon as it is known:

    <nonce> {"step": "start"}
    <nonce> {"step": "load", "ok": true, "error": null}
    <nonce> {"step": 0, "ok": true, "values": [["s", "olleh"]]}
    <nonce> {"step": 1, "ok": false, "error": "ZeroDivisionError: division by zero"}
    <nonce> {"step": "done"}

The candidate shares this process and can write any line it likes; that only lets it claim values, which
the trusted side decodes strictly and compares with expected values the candidate never sees.
"""

import json
import os
import signal
import sys

MAX_ERROR_CHARS = 300
MAX_DEPTH = 100
_SEQUENCE_TAGS = {list: "l", tuple: "t", set: "S", frozenset: "F"}


class StepTimeout(BaseException):
    """Raised by SIGALRM when a step runs past its time."""


def _on_alarm(signum, frame):
    raise StepTimeout()


def encode(value, depth=0):
    """A builtin value as tagged plain data; TypeError for any other type (subclasses included)."""
    kind = type(value)
    if value is None:
        return ["n", None]
    if kind is bool:
        return ["b", value]
    if kind is int:
        return ["i", str(value)]
    if kind is float:
        return ["f", repr(value)]
    if kind is str:
        return ["s", value]
    if depth >= MAX_DEPTH:
        raise TypeError(f"value nested deeper than {MAX_DEPTH}")
    if kind in _SEQUENCE_TAGS:
        return [_SEQUENCE_TAGS[kind], [encode(item, depth + 1) for item in value]]
    if kind is dict:
        return ["d", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]]
    raise TypeError(f"the value is a {kind.__name__}: only builtin values (None, bool, int, float, str, list, "
                    "tuple, set, frozenset, dict) can be compared")  # fmt: skip


def _timed(action, timeout_s):
    """(ok, result or error text) of action() under a timer."""
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        return True, action()
    except StepTimeout:
        raise
    except BaseException as err:  # noqa: BLE001  (SystemExit, KeyboardInterrupt: a failed step)
        return False, f"{type(err).__name__}: {err}"[:MAX_ERROR_CHARS]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def run_step(action, timeout_s):
    """(ok, result or error text) of one step; a timeout is a failed step."""
    try:
        return _timed(action, timeout_s)
    except StepTimeout:  # also when the timer fires while it is being cancelled
        return False, f"timeout after {timeout_s}s"


def make_emitter(nonce):
    """Keep a private copy of stdout, silence fds 1 and 2, return the record writer."""
    out = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)

    def emit(record):
        os.write(out, (nonce + " " + json.dumps(record) + "\n").encode("utf-8", "surrogatepass"))

    return emit


def probe_values(probes, namespace):
    """The encoded values of one test's probes (evaluated in order, in the solution's namespace; null stays null)."""
    return [None if probe is None else encode(eval(compile(probe, "<probe>", "eval"), namespace)) for probe in probes]


def main():
    nonce = sys.stdin.readline().strip()
    with open("tests.json", encoding="utf-8") as fh:
        spec = json.load(fh)
    emit = make_emitter(nonce)
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    for name in spec.get("modules", []):
        namespace[name] = __import__(name)
    emit({"step": "start"})
    with open("solution.py", encoding="utf-8", errors="replace") as fh:
        solution = fh.read()
    signal.signal(signal.SIGALRM, _on_alarm)
    timeout_s = float(spec.get("timeout_s", 2.0))
    ok, error = run_step(lambda: exec(compile(solution, "solution.py", "exec"), namespace), timeout_s)
    emit({"step": "load", "ok": ok, "error": None if ok else error})
    if ok:
        for index, probes in enumerate(spec["tests"]):
            ok_i, result = run_step(lambda probes=probes: probe_values(probes, namespace), timeout_s)
            emit(
                {"step": index, "ok": ok_i, "values": result} if ok_i else {"step": index, "ok": False, "error": result}
            )
    emit({"step": "done"})
    os._exit(0)  # skip the solution's atexit hooks and non-daemon threads


if __name__ == "__main__":
    main()
