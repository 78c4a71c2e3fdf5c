"""pytest helpers: one pytest test per golden case of an environment.

In your own test module (the env must be registered: import its module, install its entry point, or name
it by class reference, `"plugins/my_env.py:MyEnv"` / `"my_pkg.envs:MyEnv"`, as a run config's `envs:` may):

    from k2post.envs.pytest_plugin import golden_params, assert_golden, golden_test

    # one line: a parametrized test named test_golden_my_env
    test_golden_my_env = golden_test("my_env", "tests/golden/my_env.jsonl")

    # or spelled out
    @pytest.mark.parametrize("case", golden_params("my_env", "tests/golden/my_env.jsonl"))
    def test_my_env_golden(case):
        assert_golden(case)

Test ids are the case ids (`test_my_env_golden[boxed-correct]`). The path defaults to the
env's own golden file (environments/golden/<name>.jsonl, or its class's `golden_path`).
Scoring runs in-process (`DirectScorer`), so a failure shows the env's error text.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from k2post.envs.golden import GoldenCase, check_case, default_golden_path, load_golden
from k2post.envs.registry import get_environment, resolve_name
from k2post.envs.workers import DirectScorer

_SCORER = DirectScorer()


@dataclass(frozen=True)
class GoldenParam:
    """One golden case of one environment, as handed to a parametrized test."""

    env: str
    path: Path
    case: GoldenCase

    def __str__(self) -> str:
        return f"{self.env}:{self.case.id}"


def golden_params(env_name: str, path: str | Path | None = None) -> list:
    """`pytest.param`s (id = case id) for every case of the golden file; load errors raise. `env_name` is a
    registered name or a `module:Class` / `file.py:Class` reference (resolved as `k2post envs test` does)."""
    env_name, _ = resolve_name(env_name)
    golden = Path(path) if path is not None else default_golden_path(env_name)
    cases = load_golden(golden, tuple(get_environment(env_name).reward_range))
    return [pytest.param(GoldenParam(env_name, golden, case), id=case.id) for case in cases]


def assert_golden(param: GoldenParam) -> None:
    """Score the case in-process and fail the test with got/expected/diff/error when it misses."""
    result = check_case(param.env, param.case, _SCORER)
    if result.passed:
        return
    where = f"{param.path}:{param.case.line}" if param.case.line else str(param.path)
    got = "none" if result.got is None else f"{result.got:.6g}"
    parts = [f"{where} [{result.id}]: got {got}, expected {result.expected:.6g}"]
    if result.detail:
        parts.append(result.detail)
    if result.error:
        parts.append(f"error: {result.error}")
    pytest.fail("; ".join(parts), pytrace=False)


def golden_test(env_name: str, path: str | Path | None = None) -> Callable[[GoldenParam], None]:
    """A ready-made parametrized test over the golden file; assign it to a `test_*` name."""

    @pytest.mark.parametrize("golden_case", golden_params(env_name, path))
    def test_golden(golden_case: GoldenParam) -> None:
        assert_golden(golden_case)

    return test_golden
