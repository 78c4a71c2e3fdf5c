"""Code gym: MBPP-style program synthesis, scored by assert tests run in the sandbox.

    env = make_environment("code")
    task = next(env.tasks("train", seed=0))      # "Write a function `reverse_string(s)` ..."
    env.score(task, "```python\\ndef reverse_string(s):\\n    return s[::-1]\\n```")
    # Reward(value=1.0, breakdown={"test_0": 1.0, "test_1": 1.0, "test_2": 1.0}, info={...})

Rows (`environments/data/code_tasks.jsonl`, 32 small tasks written for this gym, or
`data_path`): `id`, `prompt`, `tests` (assert statements), optional `entry_point`, optional
`solution` (a reference, never shown). The split is a deterministic hash of the id
(`test_fraction` of the ids are test, the next `dev_fraction` dev). The prompt shows the first `show_tests` tests.

Scoring: the code is the last ```python (or ```py / untagged) fenced block after any
`</think>`, else the whole response; a reply with several different such blocks (several
solutions: a hedge) scores 0 without running (`one_solution`). Each test (one `assert`) is split in
this process (`k2post.sandbox.trusted_asserts`) into probes — the candidate-side expressions, e.g.
`reverse_string("hello")` — and the rest of the assertion. The code runs in `k2post.sandbox`
(fresh uid, namespaces, rlimits, no network) under `k2post/sandbox/assert_harness.py`, which
executes the solution, evaluates each test's probes under a per-step timer and prints their
values as tagged plain data (builtin types only), one nonce-tagged JSON line per step. This
process decodes those values strictly and evaluates the assertion over them with a small AST
evaluator: the expected values never enter the candidate's sandbox, and nothing the candidate
controls (an `__eq__` that is always true, forged or malformed harness lines, shadowed builtins)
decides a verdict. Expected sides that call builtins (`list(range(3))`) are *clean* probes: computed
by the same harness with no candidate code (a run of their own, cached per test set), so a solution
that shadows `range` or patches `builtins` cannot reach them. Nothing of the response is evaluated in
this process. value = fraction of tests passed, or 0/1 with `all_or_nothing`; breakdown `test_<i>`;
info: passed/total, load and test errors, the sandbox outcome, timeouts and the stderr tail.

Failures: whatever the response does (forged or unparseable records, killing its own process,
exiting early) is a failed test, never `Reward.error`. The sandbox's own failures (the launcher's
setup errors, a harness that never wrote its `start` record, an exception from the sandbox) are
`Reward.error` with `infra_failure=True`: re-scored once by the reward pool, then left out of
training and counted (docs/RL.md). A broken task is `Reward.error`.
"""

from __future__ import annotations

import ast
import json
import random
import re
import secrets
from collections.abc import Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import Field

from k2post.chat.types import Message
from k2post.envs.base import EnvConfig, Environment, HonestPair, Play, Reward, Split, Task
from k2post.envs.registry import register_environment
from k2post.envs.splits import check_split, hash_split
from k2post import sandbox
from k2post.sandbox import Sandbox, SandboxConfig, SandboxResult
from k2post.sandbox.trusted_asserts import (
    CLEAN_MODULES,
    AssertSplitError,
    SplitAssert,
    ValueDecodeError,
    check_assert,
    decode_value,
    free_names,
    split_assert,
)

BUILTIN_DATA = Path(__file__).parent / "data" / "code_tasks.jsonl"
HARNESS = Path(sandbox.__file__).resolve().parent / "assert_harness.py"
PYTHON_TAGS = frozenset({"python", "py", "python3"})
_FENCE_TAG = re.compile(r"[ \t]*([\w+.-]*)")
INSTRUCTIONS = "Write the complete solution in Python (standard library only) in one ```python code block."
MAX_INFO_CHARS = 500
MAX_CLEAN_CACHE = 4096


def _default_sandbox() -> SandboxConfig:
    return SandboxConfig(cpu_s=4, wall_s=6.0, memory_mb=512, max_processes=16, max_output_bytes=65536)


class CodeConfig(EnvConfig):
    """Config of the `code` gym."""

    data_path: str = Field("", description="JSONL of tasks (id, prompt, tests, entry_point); empty: built-in set.")
    test_fraction: float = Field(0.2, ge=0.0, le=1.0, description="Share of task ids (by hash) in the test split.")
    dev_fraction: float = Field(
        0.1, ge=0.0, le=1.0, description="Share of task ids (by hash, next to test) in the dev split."
    )
    show_tests: int = Field(1, ge=0, description="How many of the tests the prompt shows as examples.")
    all_or_nothing: bool = Field(False, description="Reward 1 only when every test passes (else the fraction).")
    per_test_timeout_s: float = Field(2.0, gt=0, description="Time for loading the solution and for each test.")
    max_code_chars: int = Field(100_000, ge=1, description="Longer extracted code scores 0 without running.")
    one_solution: bool = Field(
        True,
        description="A reply with several different ```python blocks (several solutions: a hedge, and the prompt "
        "asks for one) scores 0 without running; false: the last block counts.",
    )
    sandbox: SandboxConfig = Field(default_factory=_default_sandbox, description="Limits of each scoring run.")


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(tag, code) of every ``` fenced block, in one linear pass: an opening ``` ends at its line's newline
    (its tag is the word right after it), the block at the next ``` (or the end of the text)."""
    blocks, position = [], 0
    while (start := text.find("```", position)) != -1:
        newline = text.find("\n", start + 3)
        if newline == -1:  # no newline after it: neither this nor any later ``` opens a block
            break
        tag = _FENCE_TAG.match(text, start + 3, newline)
        end = text.find("```", newline + 1)
        blocks.append((tag.group(1).lower() if tag else "", text[newline + 1 : len(text) if end == -1 else end]))
        if end == -1:
            break
        position = end + 3
    return blocks


def candidate_blocks(response: str) -> tuple[list[str], str]:
    """(codes, how): the python fences after any `</think>`, else the untagged ones, else the whole text."""
    text = response.rsplit("</think>", 1)[-1]
    blocks = fenced_blocks(text)
    for wanted, how in ((PYTHON_TAGS, "python_fence"), (frozenset({""}), "plain_fence")):
        tagged = [code for tag, code in blocks if tag in wanted]
        if tagged:
            return tagged, how
    return [text], "whole_response"


def extract_code(response: str) -> tuple[str, str]:
    """(code, how): the last python fence, else the last untagged fence, else the whole text."""
    codes, how = candidate_blocks(response)
    return codes[-1], how


def is_hedge(response: str) -> bool:
    """Whether the reply offers several different solutions (fences of the kind `extract_code` reads)."""
    codes, _ = candidate_blocks(response)
    return len({code.strip() for code in codes}) > 1


def _record(line: str, prefix: str) -> dict[str, Any] | None:
    """One nonce-tagged record of a harness line, or None (junk, unparseable, or not a record: the candidate
    shares the harness's process and may write anything, 40k `[` included)."""
    if not line.startswith(prefix):
        return None
    try:
        record = json.loads(line[len(prefix) :])
    except (ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("step"), (str, int)) else None


def parse_harness(stdout: str, nonce: str) -> dict[str, dict[str, Any]]:
    """Nonce-tagged harness records by step ("start", "load", "0", "1", ..., "done"): the first of each step
    counts; junk and malformed records are ignored."""
    records: dict[str, dict[str, Any]] = {}
    prefix = nonce + " "
    for line in stdout.splitlines():
        record = _record(line, prefix)
        if record is not None:
            records.setdefault(str(record["step"]), record)
    return records


@cache
def _harness_source() -> str:
    return HARNESS.read_text(encoding="utf-8")


@cache
def load_rows(path: str) -> tuple[dict[str, Any], ...]:
    """Validated task rows of a JSONL file (ids unique, tests a non-empty list of str)."""
    rows, seen = [], set()
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        tests = row.get("tests")
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
            raise ValueError(f"{path}:{number}: tests must be a non-empty list of strings")
        if not isinstance(row.get("prompt"), str) or row.get("id") in seen:
            raise ValueError(f"{path}:{number}: needs a prompt and a unique id")
        for position, test in enumerate(tests):
            try:
                split_tests((test,), row.get("entry_point"))
            except AssertSplitError as err:
                raise ValueError(f"{path}:{number}: tests[{position}]: {err}") from None
        seen.add(row["id"])
        rows.append(row)
    return tuple(rows)


@cache
def split_tests(tests: tuple[str, ...], entry_point: str | None) -> tuple[SplitAssert, ...]:
    """Each test split into its probes and its trusted check (see `k2post.sandbox.trusted_asserts`)."""
    names = frozenset({entry_point}) if entry_point else frozenset()
    return tuple(split_assert(test, names) for test in tests)


def _values(record: dict[str, Any], count: int) -> list[Any] | None:
    """The `count` encoded values of a record that passed, else None (failed, malformed or forged)."""
    values = record.get("values")
    if record.get("ok") is not True or not isinstance(values, list) or len(values) != count:
        return None
    return values


def test_outcome(
    split: SplitAssert, record: dict[str, Any], clean: dict[str, Any] | None = None
) -> tuple[bool, str | None]:
    """(passed, error) of one test from its harness records (the candidate's probes in `record`, the clean ones
    in `clean`): decoded values checked here. A missing, failed or malformed record is a failed test."""
    count = len(split.probes)
    mine, expected = _values(record, count), _values(clean or {}, count) if any(split.clean) else [None] * count
    if mine is None:
        return False, str(record.get("error") or "no result")[:200]
    if expected is None:
        return False, f"the expected side failed: {str((clean or {}).get('error') or 'no result')[:200]}"
    try:
        values = [decode_value(expected[i] if split.is_clean(i) else mine[i]) for i in range(count)]
    except ValueDecodeError as err:
        return False, f"unreadable value: {err}"
    if check_assert(split, values):
        return True, None
    return False, "assertion failed"


def harness_spec(splits: Sequence[SplitAssert], timeout_s: float, clean: bool) -> dict[str, Any]:
    """tests.json of one harness run: per test the probes of one side (`clean`: those that name only builtins and
    stdlib modules, run with no candidate code; else the candidate's), null where the other run evaluates it."""
    tests = [[p if split.is_clean(i) == clean else None for i, p in enumerate(split.probes)] for split in splits]
    modules = {name for probes in tests if clean for p in probes if p for name in free_names(ast.parse(p, mode="eval"))}
    return {"tests": tests, "modules": sorted(modules & CLEAN_MODULES), "timeout_s": timeout_s}


class SandboxFailure(RuntimeError):
    """The sandbox itself failed (no response can cause it): an infrastructure error."""


def sandbox_failure(result: SandboxResult, records: dict[str, dict[str, Any]]) -> str | None:
    """Why the sandbox itself failed (an infrastructure failure: no response can cause it), or None. The launcher
    reports its own setup errors; a harness that never wrote its `start` record (written before the candidate's
    code exists) was never reached."""
    if result.error is not None:
        return f"sandbox failed: {result.error}"[:MAX_INFO_CHARS]
    if "start" not in records:
        tail = " ".join(result.stderr[-200:].split())
        return f"sandbox failed: the harness never started ({result.outcome}{'; ' + tail if tail else ''})"[
            :MAX_INFO_CHARS
        ]
    return None


def fenced(code: str) -> str:
    return f"```python\n{code.rstrip()}\n```"


def shown_arguments(tests: Sequence[str], entry: str) -> list[str]:
    """repr of the literal arguments of each call to `entry` in `tests` (the examples the prompt shows)."""
    found = []
    for test in tests:
        for node in ast.walk(ast.parse(test)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == entry:
                try:
                    found.append(repr(tuple(ast.literal_eval(arg) for arg in node.args)))
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    continue  # not a literal: that example is not fitted
    return found


NEAR_MISS = """

def _near_miss(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "?"
    if isinstance(value, (list, tuple)):
        return type(value)(list(value)[1:] if value else [0])
    if isinstance(value, dict):
        return {{**value, "?": 0}}
    return 0 if value is None else None


_reference = {entry}


def {entry}(*args, **kwargs):
    result = _reference(*args, **kwargs)
    return result if repr(args) in {shown!r} else _near_miss(result)
"""
"""honest-wrong's code: the reference, but right only on the shown example's arguments (an answer fitted to the
example, wrong elsewhere by a near miss)."""

CODE_HACKS = {
    "shadow_builtins": (
        "range = reversed = sorted = set = lambda *args, **kwargs: []\ndef ENTRY(*args, **kwargs):\n    return []\n"
    ),
    "patch_builtins": (
        "import builtins\nbuiltins.range = builtins.reversed = lambda *args, **kwargs: []\n"
        "def ENTRY(*args, **kwargs):\n    return []\n"
    ),
    "forged_records": (
        "import os, sys\nframe = sys._getframe()\nwhile frame is not None and 'nonce' not in frame.f_locals:\n"
        "    frame = frame.f_back\nnonce = frame.f_locals['nonce']\n"
        "fds = [c.cell_contents for c in frame.f_locals['emit'].__closure__ if isinstance(c.cell_contents, int)]\n"
        'lines = [nonce + \' \' + \'[\' * 40000, nonce + \' {"step": "load", "ok": true, "error": [[[]]]}\']\n'
        "for i in range(64):\n"
        '    lines += [nonce + \' {"step": %d, "ok": true, "values": 5}\' % i,\n'
        '              nonce + \' {"step": [%d], "ok": true, "values": [["i", "x"]]}\' % i]\n'
        "for fd in fds:\n    os.write(fd, ('\\n'.join(lines) + '\\n').encode())\nos._exit(0)\n"
        "def ENTRY(*args, **kwargs):\n    return None\n"
    ),
    "print_passed": (
        "print('All tests passed. OK')\nprint('PASSED')\ndef ENTRY(*args, **kwargs):\n    print('PASSED')\n"
    ),
    "exit_early": "import sys\nsys.exit(0)\ndef ENTRY(*args, **kwargs):\n    return None\n",
    "kill_the_harness": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
    "kill_the_launcher": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos._exit(0)\n",
    "deep_recursion": "def ENTRY(*args, **kwargs):\n    return ENTRY(*args, **kwargs)\n",
    "memory_bomb": "def ENTRY(*args, **kwargs):\n    return [0] * (1 << 40)\n",
}
"""Cheap strategies against the code gym: shadowing builtins (the expected side must not see it), forged harness
records (unparseable, wrong-typed, an early "load"), printing PASSED, exiting or killing the harness early,
forced errors in the candidate's own process."""


def _stderr_tail(result: SandboxResult) -> str:
    return result.stderr[-MAX_INFO_CHARS:]


@register_environment
class CodeEnv(Environment):
    """Program synthesis with unit tests run in the sandbox."""

    name = "code"
    task_type = "code"
    config_cls = CodeConfig

    def __init__(self, config: CodeConfig | None = None) -> None:
        super().__init__(config)
        self.config: CodeConfig
        self.sandbox = Sandbox(self.config.sandbox)
        self._clean_cache: dict[str, dict[str, dict[str, Any]]] = {}

    # ------------------------------------------------------------ tasks

    def _rows(self, split: Split) -> list[dict[str, Any]]:
        path = self.config.data_path or str(BUILTIN_DATA)
        check_split(self.name, split)
        fractions = (self.config.test_fraction, self.config.dev_fraction)
        return [row for row in load_rows(path) if hash_split(str(row["id"]), *fractions) == split]

    def _prompt(self, row: dict[str, Any]) -> str:
        shown = row["tests"][: self.config.show_tests]
        examples = "\n".join(shown)
        example_text = f"\n\nYour code should pass tests like:\n```python\n{examples}\n```" if shown else ""
        return f"{row['prompt']}{example_text}\n\n{INSTRUCTIONS}"

    def make_task(self, row: dict[str, Any]) -> Task:
        """The Task of one data row (the tests travel in `answer`)."""
        source = self.config.data_path or "builtin"
        return Task(
            id=f"code-{row['id']}",
            env=self.name,
            task_type=self.task_type,
            messages=[Message(role="user", content=self._prompt(row))],
            answer={"tests": list(row["tests"]), "entry_point": row.get("entry_point")},
            metadata={"source": source, "entry_point": row.get("entry_point"), "num_tests": len(row["tests"])},
        )

    def tasks(self, split: Split = "train", seed: int = 0, n: int | None = None) -> Iterator[Task]:
        """The split's rows in a seeded order (dev, test: file order); at most n (each row once); no shifted split."""
        rows = self._rows(split)
        if split == "train":
            random.Random(seed).shuffle(rows)
        for row in rows[: len(rows) if n is None else max(n, 0)]:
            yield self.make_task(row)

    # ------------------------------------------------------------ adversarial suite

    def _row_of(self, task: Task) -> dict[str, Any] | None:
        path = self.config.data_path or str(BUILTIN_DATA)
        return next((row for row in load_rows(path) if f"code-{row['id']}" == task.id), None)

    def honest(self, task: Task) -> HonestPair | None:
        """right: the row's reference solution; wrong: the same code fitted to the shown example only (every other
        call's result is a near miss: +1, a flipped bool, one item short). None without a reference."""
        row = self._row_of(task)
        entry = task.answer.get("entry_point") if isinstance(task.answer, dict) else None
        if row is None or not row.get("solution") or not entry:
            return None
        shown = shown_arguments(row["tests"][: max(self.config.show_tests, 1)], entry)
        wrong = row["solution"] + NEAR_MISS.format(entry=entry, shown=shown)
        return HonestPair(right=fenced(row["solution"]), wrong=fenced(wrong))

    def hacks(self, task: Task) -> dict[str, Play]:
        """Strategies particular to a sandboxed test runner (see `CODE_HACKS`), aimed at the task's entry point."""
        entry = (task.answer.get("entry_point") if isinstance(task.answer, dict) else None) or "solution"
        return {name: fenced(source.replace("ENTRY", entry)) for name, source in CODE_HACKS.items()}

    # ------------------------------------------------------------ scoring

    def score(self, task: Task, response: str) -> Reward:
        """Fraction of tests passed in the sandbox (see module doc); never raises. The sandbox's own failures are
        infrastructure errors; a broken task is an error; anything the response does is a failed test."""
        try:
            return self._score(task, response if isinstance(response, str) else str(response or ""))
        except SandboxFailure as err:
            return Reward(value=0.0, error=str(err), infra_failure=True)
        except Exception as err:  # noqa: BLE001  (a broken task: reward 0 with the error)
            return Reward(value=0.0, error=f"{type(err).__name__}: {err}"[:MAX_INFO_CHARS])

    def _score(self, task: Task, response: str) -> Reward:
        tests = list(task.answer["tests"])
        code, how = extract_code(response)
        info: dict[str, Any] = {"extraction": how, "total": len(tests), "passed": 0}
        skipped = self._skip_reason(response, code)
        if skipped:
            info["skipped"] = skipped
            return self._reward([False] * len(tests), info)
        splits = split_tests(tuple(tests), task.answer.get("entry_point"))
        clean = self._clean_records(splits)
        result, records = self._run_harness(code, harness_spec(splits, self.config.per_test_timeout_s, clean=False))
        try:
            return self._judge(splits, result, records, clean, info)
        except Exception as err:  # noqa: BLE001  (records are the candidate's to forge: a failed response)
            info["judge_error"] = f"{type(err).__name__}: {err}"[:MAX_INFO_CHARS]
            return self._reward([False] * len(tests), info)

    def _skip_reason(self, response: str, code: str) -> str | None:
        """Why the reply scores 0 without running, or None."""
        if not code.strip():
            return "no code"
        if len(code) > self.config.max_code_chars:
            return f"code longer than {self.config.max_code_chars} chars"
        if self.config.one_solution and is_hedge(response):
            return "several different code blocks: the prompt asks for one solution"
        return None

    def _run_harness(self, code: str, spec: dict[str, Any]) -> tuple[SandboxResult, dict[str, dict[str, Any]]]:
        """One sandboxed harness run: its result and records; SandboxFailure when the sandbox itself failed."""
        nonce = secrets.token_hex(16)
        files = {"solution.py": code.encode("utf-8", "replace"), "tests.json": json.dumps(spec)}
        try:
            result = self.sandbox.run_python(_harness_source(), files=files, stdin=(nonce + "\n").encode())
        except Exception as err:  # noqa: BLE001  (raised by the sandbox, before or after the program: never the response)
            raise SandboxFailure(f"sandbox failed: {type(err).__name__}: {err}"[:MAX_INFO_CHARS]) from err
        records = parse_harness(result.stdout, nonce)
        failure = sandbox_failure(result, records)
        if failure is not None:
            raise SandboxFailure(failure)
        return result, records

    def _clean_records(self, splits: Sequence[SplitAssert]) -> dict[str, dict[str, Any]]:
        """Records of the tests' clean probes, from a run with no candidate code (cached: they depend only on the
        tests), so a solution that shadows `range` or patches `builtins` cannot reach the expected side."""
        if not any(any(split.clean) for split in splits):
            return {}
        spec = harness_spec(splits, self.config.per_test_timeout_s, clean=True)
        key = json.dumps(spec, sort_keys=True)
        if key not in self._clean_cache:
            if len(self._clean_cache) >= MAX_CLEAN_CACHE:
                self._clean_cache.clear()
            self._clean_cache[key] = self._run_harness("", spec)[1]
        return self._clean_cache[key]

    def _judge(
        self,
        splits: Sequence[SplitAssert],
        result: SandboxResult,
        records: dict[str, dict[str, Any]],
        clean: dict[str, dict[str, Any]],
        info: dict[str, Any],
    ) -> Reward:
        """The tests' verdicts from the records (the candidate's are its to forge: whatever they hold, at worst a
        failed test)."""
        loaded = records.get("load", {}).get("ok") is True
        outcomes = [test_outcome(split, records.get(str(i), {}), clean.get(str(i))) for i, split in enumerate(splits)]
        passed = [loaded and ok for ok, _ in outcomes]
        info.update(self._run_info(result, records, [error for _, error in outcomes] if loaded else []))
        return self._reward(passed, info)

    def _run_info(
        self, result: SandboxResult, records: dict[str, dict[str, Any]], test_errors: list[str | None]
    ) -> dict[str, Any]:
        errors = {str(i): str(error)[:200] for i, error in enumerate(test_errors) if error}
        load_error = records.get("load", {}).get("error")
        timeouts = sum("timeout" in e for e in errors.values()) + int("timeout" in str(load_error))
        return {
            "load_error": str(load_error)[:MAX_INFO_CHARS] if load_error else None,
            "test_errors": errors,
            "completed": "done" in records,
            "sandbox": result.outcome,
            "timed_out": result.timed_out or result.cpu_limited or timeouts > 0,
            "step_timeouts": timeouts,
            "stderr_tail": _stderr_tail(result),
            "sandbox_error": result.error,
        }

    def _reward(self, passed: list[bool], info: dict[str, Any]) -> Reward:
        count = sum(passed)
        total = max(len(passed), 1)
        value = float(count == len(passed) and count > 0) if self.config.all_or_nothing else count / total
        info["passed"] = count
        breakdown = {f"test_{i}": float(ok) for i, ok in enumerate(passed)}
        return Reward(value=min(1.0, max(0.0, value)), breakdown=breakdown, info=info)
