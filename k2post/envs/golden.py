"""Golden-file reward regression tests: fixed (task, response) pairs with their expected reward.

A golden file is JSONL, one case per line (blank lines are skipped):

    {"id": "boxed-correct", "task": {<Task JSON>}, "response": "\\\\boxed{4}", "expected": 1.0}
    {"id": "gen-3", "task": {"seed": 0, "split": "train", "index": 3}, "response": "...",
     "expected": 0.0, "tol": 1e-6, "config": {"difficulty": 2}, "expected_breakdown": {"exact": 0.0}}
    {"id": "tool-ok", "task": {...}, "turns": [{"role": "assistant", "tool_calls": [...]}, ...],
     "expected": 1.0}

`task` is a full Task or a reference into the env's own generator (`seed`, `split`, `index`);
`turns` (multi-turn envs) are assistant messages replayed through reset/step, then score_state.
A case passes when |got - expected| <= tol, every `expected_breakdown` entry matches within tol,
and scoring recorded no error (unless `"expect_error": true`).

    results = run_golden("math")                      # environments/golden/math.jsonl
    results = run_golden("my_env", "golden/my_env.jsonl", isolated=True)   # via RewardPool

CLI: `k2post envs test [NAME ...] [--golden PATH] [--isolated]`; pytest: `k2post.envs.pytest_plugin`.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from k2post.config.loader import format_validation_error
from k2post.envs.base import Environment, Reward, Split, Task
from k2post.envs.registry import builtin_data_dir, get_environment, resolve_name
from k2post.envs.workers import DirectScorer, EnvCache, RewardPool, ScoreItem, error_text

BUILTIN_GOLDEN_DIR = builtin_data_dir("golden")


class GoldenFileError(ValueError):
    """A golden file is missing or malformed; the message names file:line and the field."""


MAX_TASK_INDEX = 10_000


class TaskRef(BaseModel):
    """A task by position in the environment's own generator."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = Field(0, description="Generator seed.")
    split: Split = Field("train", description="Split: train, dev, test or shifted (k2post.envs.splits).")
    index: int = Field(
        ge=0,
        le=MAX_TASK_INDEX,
        description=f"0-based position in env.tasks(split, seed) (at most {MAX_TASK_INDEX}: the generator is walked "
        "to it; a later task belongs in the file as a full Task).",
    )


class GoldenCase(BaseModel):
    """One line of a golden file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, description="Case id, unique within the file.")
    task: Task | TaskRef = Field(description="A full Task, or {seed, split, index} into env.tasks().")
    response: str | None = Field(None, description="Final assistant response (single-turn scoring).")
    turns: list[dict[str, Any]] | None = Field(None, description="Assistant messages replayed via reset/step.")
    expected: float = Field(allow_inf_nan=False, description="Expected reward value (a finite number).")
    tol: float = Field(
        1e-6, ge=0, allow_inf_nan=False, description="Absolute tolerance on value and breakdown entries."
    )
    config: dict[str, Any] = Field(default_factory=dict, description="Environment config for this case.")
    expected_breakdown: dict[str, float] | None = Field(None, description="Expected breakdown entries.")
    expect_error: bool = Field(False, description="The scorer is expected to record an error.")
    _line: int = PrivateAttr(0)

    @property
    def line(self) -> int:
        """Line number in its file (set by load_golden; 0 when built in code)."""
        return self._line

    @field_validator("task", mode="before")
    @classmethod
    def _pick_task_kind(cls, value: Any) -> Any:
        if isinstance(value, dict) and {"index", "seed", "split"} & value.keys() and "messages" not in value:
            return TaskRef.model_validate(value)
        if isinstance(value, dict):
            return Task.model_validate(value)
        return value

    @model_validator(mode="after")
    def _one_payload(self) -> GoldenCase:
        if (self.response is None) == (self.turns is None):
            raise ValueError("give exactly one of `response` or `turns`")
        return self


@dataclass(frozen=True)
class CaseResult:
    """Outcome of one golden case; `diff` = got - expected (None when scoring failed outright)."""

    id: str
    passed: bool
    got: float | None
    expected: float
    diff: float | None
    error: str | None = None
    detail: str = ""


def default_golden_path(env_name: str) -> Path:
    """The env's own golden file: its class's `golden_path`, else environments/golden/<name>.jsonl."""
    cls = get_environment(env_name)
    own = getattr(cls, "golden_path", None)
    if own:
        module_file = getattr(sys.modules.get(cls.__module__), "__file__", None)
        base = Path(module_file).parent if module_file else Path.cwd()
        return (base / own).resolve()
    return BUILTIN_GOLDEN_DIR / f"{env_name}.jsonl"


def _parse_line(text: str, where: str, number: int) -> GoldenCase:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise GoldenFileError(f"{where}: invalid JSON: {err.msg} (column {err.colno})") from None
    except RecursionError:
        raise GoldenFileError(f"{where}: JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise GoldenFileError(f"{where}: a case must be a JSON object, got {type(data).__name__}")
    try:
        case = GoldenCase.model_validate(data)
    except ValidationError as err:
        raise GoldenFileError(format_validation_error(err, GoldenCase, where)) from None
    case._line = number
    return case


def load_golden(path: str | Path, reward_range: tuple[float, float] | None = None) -> list[GoldenCase]:
    """Parse a golden JSONL file; errors read `file:line: field: problem`. With the env's `reward_range`, an
    `expected` outside it is an error too (no scorer may return it: out-of-range rewards are scoring errors)."""
    path = Path(path)
    if not path.is_file():
        raise GoldenFileError(f"{path}: golden file not found")
    cases: list[GoldenCase] = []
    seen: dict[str, int] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise GoldenFileError(f"{path}: not UTF-8 text (byte {err.start}: {err.reason})") from None
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        case = _parse_line(text, f"{path}:{number}", number)
        if case.id in seen:
            raise GoldenFileError(f"{path}:{number}: id: duplicate id {case.id!r} (first on line {seen[case.id]})")
        seen[case.id] = number
        if reward_range is not None and not reward_range[0] <= case.expected <= reward_range[1]:
            raise GoldenFileError(
                f"{path}:{number}: expected: {case.expected:g} is outside the env's reward_range "
                f"[{reward_range[0]:g}, {reward_range[1]:g}]"
            )
        cases.append(case)
    if not cases:
        raise GoldenFileError(f"{path}: no cases")
    return cases


def resolve_task(env: Environment, ref: Task | TaskRef) -> Task:
    """The case's Task: itself, or the `index`-th task of env.tasks(split, seed)."""
    if isinstance(ref, Task):
        return ref
    generated = env.tasks(ref.split, seed=ref.seed, n=ref.index + 1)
    task = next(itertools.islice(generated, ref.index, None), None)
    if task is None:
        raise ValueError(f"task index {ref.index} is past the end of split {ref.split!r} (seed {ref.seed})")
    return task


def case_item(env_name: str, case: GoldenCase, envs: EnvCache) -> ScoreItem:
    """The ScoreItem of a case (a task reference is resolved with the env in this process)."""
    env, _ = envs.get(env_name, case.config)
    task = resolve_task(env, case.task)
    if task.env != env_name:
        raise ValueError(f"task.env is {task.env!r}, not {env_name!r}")
    return ScoreItem(env=env_name, task=task, response=case.response, config=case.config, turns=case.turns)


def _breakdown_problems(case: GoldenCase, reward: Reward) -> list[str]:
    problems = []
    for key, want in (case.expected_breakdown or {}).items():
        got = reward.breakdown.get(key)
        if got is None:
            problems.append(f"breakdown[{key!r}] missing")
        elif not abs(got - want) <= case.tol:
            problems.append(f"breakdown[{key!r}] = {got:g}, expected {want:g}")
    return problems


def judge(case: GoldenCase, reward: Reward) -> CaseResult:
    """Compare a reward with the case's expectations."""
    diff = reward.value - case.expected
    problems = [] if abs(diff) <= case.tol else [f"value off by {diff:+.6g}"]
    problems += _breakdown_problems(case, reward)
    if reward.error is not None and not case.expect_error:
        problems.append("scoring error")
    if case.expect_error and reward.error is None:
        problems.append("expected a scoring error, got none")
    ok = not problems and math.isfinite(reward.value)
    return CaseResult(case.id, ok, reward.value, case.expected, diff, reward.error, "; ".join(problems))


def check_case(env_name: str, case: GoldenCase, scorer: DirectScorer | None = None) -> CaseResult:
    """Score and judge one case in this process (the pytest helper uses it)."""
    scorer = scorer or DirectScorer()
    try:
        item = case_item(env_name, case, scorer.envs)
    except Exception as err:
        return CaseResult(case.id, False, None, case.expected, None, error_text(err), "no task")
    return judge(case, scorer.score(item))


def run_golden(
    env_name: str, path: str | Path | None = None, isolated: bool = False, pool: RewardPool | None = None
) -> list[CaseResult]:
    """Run every case of a golden file (default: the env's own); `isolated` scores via a RewardPool."""
    env_name, _ = resolve_name(env_name)  # a `file.py:Class` reference: its class's registered name
    cls = get_environment(env_name)  # unknown name → EnvironmentRegistryError before reading any file
    cases = load_golden(path if path is not None else default_golden_path(env_name), tuple(cls.reward_range))
    if not (isolated or pool):
        scorer = DirectScorer()
        return [check_case(env_name, case, scorer) for case in cases]
    return _run_in_pool(env_name, cases, pool)


def _run_in_pool(env_name: str, cases: list[GoldenCase], pool: RewardPool | None) -> list[CaseResult]:
    envs = EnvCache()
    results: dict[int, CaseResult] = {}
    items: list[tuple[int, ScoreItem]] = []
    for position, case in enumerate(cases):
        try:
            items.append((position, case_item(env_name, case, envs)))
        except Exception as err:
            results[position] = CaseResult(case.id, False, None, case.expected, None, error_text(err), "no task")
    owned = pool is None
    pool = pool or RewardPool(num_workers=min(2, max(1, len(items))), timeout_s=30.0)
    try:
        rewards = pool.score_batch([item for _, item in items])
    finally:
        if owned:
            pool.close()
    for (position, _), reward in zip(items, rewards):
        results[position] = judge(cases[position], reward)
    return [results[position] for position in range(len(cases))]
