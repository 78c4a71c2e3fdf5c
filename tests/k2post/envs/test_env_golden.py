"""Golden files: format errors name file:line and field; cases pass/fail as expected, direct or isolated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k2post.envs import EnvironmentRegistryError
from k2post.envs.golden import (
    BUILTIN_GOLDEN_DIR,
    GoldenFileError,
    TaskRef,
    default_golden_path,
    load_golden,
    run_golden,
)

HERE = Path(__file__).resolve().parent
ECHO_GOLDEN = HERE / "golden" / "toy_echo.jsonl"
COUNTER_GOLDEN = HERE / "golden" / "toy_counter.jsonl"
TASK = {
    "id": "t",
    "env": "toy_echo",
    "task_type": "toy",
    "messages": [{"role": "user", "content": "Repeat: a"}],
    "answer": "a",
}


def _write(tmp_path: Path, *lines: object) -> Path:
    path = tmp_path / "cases.jsonl"
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


def test_shipped_toy_golden_files_pass():
    for env_name, path in [("toy_echo", ECHO_GOLDEN), ("toy_counter", COUNTER_GOLDEN)]:
        results = run_golden(env_name, path)
        assert results and all(r.passed for r in results), [r for r in results if not r.passed]


def test_task_refs_and_full_tasks_load():
    cases = load_golden(ECHO_GOLDEN)
    assert [c.id for c in cases] == ["exact", "contains", "generated-train-2", "generated-upper", "wrong"]
    assert isinstance(cases[2].task, TaskRef) and cases[2].task.index == 2
    assert cases[2].line == 4  # the blank line 3 is skipped but counted
    assert cases[3].tol == 0.01 and cases[0].tol == 1e-6


@pytest.mark.parametrize(
    "lines, message",
    [
        (["{not json"], "cases.jsonl:1: invalid JSON: Expecting property name enclosed in double quotes (column 2)"),
        (["[1, 2]"], "cases.jsonl:1: a case must be a JSON object, got list"),
        ([{"id": "a", "task": TASK, "response": "a"}], "cases.jsonl:1: expected: Field required"),
        (
            [{"id": "a", "task": TASK, "response": "a", "expected": "high"}],
            "cases.jsonl:1: expected: Input should be a valid number",
        ),
        (
            [{"id": "a", "task": TASK, "response": "a", "expected": 1, "tolerance": 0.1}],
            "cases.jsonl:1: tolerance: unknown key",
        ),
        (
            [{"id": "a", "task": {"seed": 0, "index": -1}, "response": "a", "expected": 1}],
            "cases.jsonl:1: task.index: Input should be greater than or equal to 0",
        ),
        (
            [{"id": "a", "task": {"id": "t", "env": "toy_echo"}, "response": "a", "expected": 1}],
            "cases.jsonl:1: task.task_type: Field required",
        ),
        (
            [{"id": "a", "task": TASK, "expected": 1}],
            "cases.jsonl:1: <top level>: give exactly one of `response` or `turns`",
        ),
        (
            [
                {"id": "a", "task": TASK, "response": "a", "expected": 1},
                "",
                {"id": "a", "task": TASK, "response": "b", "expected": 0},
            ],
            "cases.jsonl:3: id: duplicate id 'a' (first on line 1)",
        ),
        ([""], "cases.jsonl: no cases"),
        (
            [{"id": "a", "task": {"seed": 0, "index": 10**9}, "response": "a", "expected": 1}],
            "cases.jsonl:1: task.index: Input should be less than or equal to 10000",
        ),
        (
            [{"id": "a", "task": TASK, "response": "a", "expected": float("nan")}],
            "cases.jsonl:1: expected: Input should be a finite number",
        ),
        (['{"id": "a", "task": ' + "[" * 5000 + "]" * 5000 + "}"], "cases.jsonl:1: JSON nested too deeply"),
    ],
)
def test_load_errors_name_file_line_and_field(tmp_path, lines, message):
    path = _write(tmp_path, *lines)
    with pytest.raises(GoldenFileError) as err:
        load_golden(path)
    assert str(err.value).startswith(str(path.parent / message.split(":")[0])), str(err.value)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("expected, ok", [(2.0, False), (-0.1, False), (1.0, True), (0.0, True)])
def test_expected_outside_the_reward_range_is_rejected_at_load(tmp_path, expected, ok):
    path = _write(tmp_path, {"id": "a", "task": TASK, "response": "a", "expected": expected})
    assert load_golden(path)  # without a range: any float
    if ok:
        assert run_golden("toy_echo", path)[0].expected == expected
        return
    with pytest.raises(GoldenFileError) as err:
        run_golden("toy_echo", path)
    assert str(err.value) == f"{path}:1: expected: {expected:g} is outside the env's reward_range [0, 1]"


def test_a_golden_file_that_is_not_utf8_is_named(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes('{"id": "caf\u00e9"}\n'.encode("latin-1"))
    with pytest.raises(GoldenFileError, match=r"latin1\.jsonl: not UTF-8 text \(byte 11: invalid continuation byte\)"):
        load_golden(path)


def test_missing_file_and_unknown_env(tmp_path):
    with pytest.raises(GoldenFileError, match="golden file not found"):
        load_golden(tmp_path / "nope.jsonl")
    with pytest.raises(EnvironmentRegistryError, match="did you mean 'toy_echo'"):
        run_golden("toy_ecko", ECHO_GOLDEN)


def test_failures_are_reported_not_raised(tmp_path):
    path = _write(
        tmp_path,
        {"id": "off", "task": TASK, "response": "a", "expected": 0.5},
        {
            "id": "breakdown",
            "task": TASK,
            "response": "a",
            "expected": 1,
            "expected_breakdown": {"exact": 0, "style": 1},
        },
        {"id": "past-end", "task": {"seed": 0, "index": 99}, "response": "a", "expected": 1},
        {"id": "wrong-env", "task": {**TASK, "env": "math"}, "response": "a", "expected": 1},
        {"id": "bad-config", "task": TASK, "config": {"uper": 1}, "response": "a", "expected": 1},
        {"id": "ok", "task": TASK, "response": "a", "expected": 1},
    )
    results = {r.id: r for r in run_golden("toy_echo", path)}
    assert results["off"].detail == "value off by +0.5" and results["off"].diff == pytest.approx(0.5)
    assert results["breakdown"].detail == "breakdown['exact'] = 1, expected 0; breakdown['style'] missing"
    assert results["past-end"].error == "ValueError: task index 99 is past the end of split 'train' (seed 0)"
    assert results["wrong-env"].error == "ValueError: task.env is 'math', not 'toy_echo'"
    assert "config: uper: unknown key" in results["bad-config"].error
    assert [r.passed for r in results.values()] == [False] * 5 + [True]


def test_scoring_errors_fail_unless_expected(tmp_path):
    task = {**TASK, "env": "toy_faulty"}
    path = _write(
        tmp_path,
        {"id": "raises", "task": task, "response": "raise", "expected": 0.0},
        {"id": "raises-expected", "task": task, "response": "raise", "expected": 0.0, "expect_error": True},
        {"id": "no-error", "task": task, "response": "ok", "expected": 1.0, "expect_error": True},
    )
    results = run_golden("toy_faulty", path)
    assert [r.passed for r in results] == [False, True, False]
    assert results[0].detail == "scoring error" and results[0].error.startswith("ValueError: bad response (at ")
    toy_lines = (Path(__file__).parent / "k2post_toy_envs.py").read_text().splitlines()
    raise_line = toy_lines.index('            raise ValueError("bad response")') + 1
    assert results[0].error.endswith(f"k2post_toy_envs.py:{raise_line})")  # the scorer's raise line
    assert results[2].detail == "expected a scoring error, got none"


def test_isolated_matches_direct_and_times_out(tmp_path):
    direct = run_golden("toy_counter", COUNTER_GOLDEN)
    isolated = run_golden("toy_counter", COUNTER_GOLDEN, isolated=True)
    assert [(r.id, r.passed, r.got) for r in direct] == [(r.id, r.passed, r.got) for r in isolated]
    from k2post.envs.workers import RewardPool

    hang = _write(tmp_path, {"id": "hang", "task": {**TASK, "env": "toy_faulty"}, "response": "hang", "expected": 1})
    with RewardPool(num_workers=1, timeout_s=0.5) as pool:
        (result,) = run_golden("toy_faulty", hang, pool=pool)
    assert not result.passed and result.error == "timeout after 0.5s"


def test_default_path_of_builtins():
    assert default_golden_path("toy_echo") == BUILTIN_GOLDEN_DIR / "toy_echo.jsonl"


@pytest.mark.parametrize("path", sorted(BUILTIN_GOLDEN_DIR.glob("*.jsonl")), ids=lambda p: p.stem)
def test_builtin_golden_files_load(path):
    assert load_golden(path)
