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
`</think>`, else the whole response. Each test (one `assert`) is split in this process
(`k2post.sandbox.trusted_asserts`) into probes — the candidate-side expressions, e.g.
`reverse_string("hello")` — and the rest of the assertion. The code runs in `k2post.sandbox`
(fresh uid, namespaces, rlimits, no network) under `k2post/sandbox/assert_harness.py`, which
executes the solution, evaluates each test's probes under a per-step timer and prints their
values as tagged plain data (builtin types only), one nonce-tagged JSON line per step. This
process decodes those values strictly and evaluates the assertion over them with a small AST
evaluator: the expected values never enter the sandbox, and nothing the candidate controls
(an `__eq__` that is always true, forged harness lines) decides a verdict. Nothing of the
response is evaluated in this process. value = fraction of tests passed,
or 0/1 with `all_or_nothing`; breakdown `test_<i>`; info: passed/total, load and test
errors, the sandbox outcome, timeouts and the stderr tail. Any response gives a reward in
[0, 1]; a scoring failure gives 0 with `Reward.error`.
"""

from __future__ import annotations

import json
import random
import re
import secrets
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import Field

from k2post.chat.types import Message
from k2post.envs.base import EnvConfig, Environment, Reward, Split, Task
from k2post.envs.registry import register_environment
from k2post.envs.splits import check_split, hash_split
from k2post import sandbox
from k2post.sandbox import Sandbox, SandboxConfig, SandboxResult
from k2post.sandbox.trusted_asserts import (
    AssertSplitError,
    SplitAssert,
    ValueDecodeError,
    check_assert,
    decode_value,
    split_assert,
)

BUILTIN_DATA = Path(__file__).parent / "data" / "code_tasks.jsonl"
HARNESS = Path(sandbox.__file__).resolve().parent / "assert_harness.py"
PYTHON_TAGS = frozenset({"python", "py", "python3"})
_FENCE_TAG = re.compile(r"[ \t]*([\w+.-]*)")
INSTRUCTIONS = "Write the complete solution in Python (standard library only) in one ```python code block."
MAX_INFO_CHARS = 500


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


def extract_code(response: str) -> tuple[str, str]:
    """(code, how): the last python fence, else the last untagged fence, else the whole text."""
    text = response.rsplit("</think>", 1)[-1]
    blocks = fenced_blocks(text)
    for wanted, how in ((PYTHON_TAGS, "python_fence"), (frozenset({""}), "plain_fence")):
        tagged = [code for tag, code in blocks if tag in wanted]
        if tagged:
            return tagged[-1], how
    return text, "whole_response"


def parse_harness(stdout: str, nonce: str) -> dict[str, dict[str, Any]]:
    """Nonce-tagged harness records by step ("load", "0", "1", ..., "done"); junk ignored."""
    records: dict[str, dict[str, Any]] = {}
    prefix = nonce + " "
    for line in stdout.splitlines():
        if not line.startswith(prefix):
            continue
        try:
            record = json.loads(line[len(prefix) :])
        except ValueError:
            continue
        if isinstance(record, dict) and "step" in record:
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


def test_outcome(split: SplitAssert, record: dict[str, Any]) -> tuple[bool, str | None]:
    """(passed, error) of one test from its harness record: decoded values checked here."""
    if record.get("ok") is not True:
        return False, str(record.get("error") or "no result")
    try:
        values = [decode_value(value) for value in record.get("values") or []]
    except ValueDecodeError as err:
        return False, f"unreadable value: {err}"
    if check_assert(split, values):
        return True, None
    return False, "assertion failed"


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

    # ------------------------------------------------------------ scoring

    def score(self, task: Task, response: str) -> Reward:
        """Fraction of tests passed in the sandbox (see module doc); never raises."""
        try:
            return self._score(task, response if isinstance(response, str) else str(response or ""))
        except Exception as err:  # noqa: BLE001  (a broken task or sandbox: reward 0 with the error)
            return Reward(value=0.0, error=f"{type(err).__name__}: {err}"[:MAX_INFO_CHARS])

    def _score(self, task: Task, response: str) -> Reward:
        tests = list(task.answer["tests"])
        code, how = extract_code(response)
        info: dict[str, Any] = {"extraction": how, "total": len(tests), "passed": 0}
        if not code.strip() or len(code) > self.config.max_code_chars:
            info["skipped"] = "no code" if not code.strip() else f"code longer than {self.config.max_code_chars} chars"
            return self._reward([False] * len(tests), info)
        splits = split_tests(tuple(tests), task.answer.get("entry_point"))
        nonce = secrets.token_hex(16)
        probes = [list(split.probes) for split in splits]
        files = {
            "solution.py": code.encode("utf-8", "replace"),
            "tests.json": json.dumps({"tests": probes, "timeout_s": self.config.per_test_timeout_s}),
        }
        result = self.sandbox.run_python(_harness_source(), files=files, stdin=(nonce + "\n").encode())
        records = parse_harness(result.stdout, nonce)
        loaded = records.get("load", {}).get("ok") is True
        outcomes = [test_outcome(split, records.get(str(i), {})) for i, split in enumerate(splits)]
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
