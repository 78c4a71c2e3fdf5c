"""The pytest helper: one test per golden case, readable failures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k2post.envs.golden import BUILTIN_GOLDEN_DIR, GoldenFileError
from k2post.envs.pytest_plugin import assert_golden, golden_params, golden_test

HERE = Path(__file__).resolve().parent

# The one-line form: a parametrized test per case of the toy env's golden file.
test_golden_toy_echo = golden_test("toy_echo", HERE / "golden" / "toy_echo.jsonl")


@pytest.mark.parametrize("case", golden_params("toy_counter", HERE / "golden" / "toy_counter.jsonl"))
def test_golden_toy_counter(case):
    assert_golden(case)


BUILTIN_MATH = BUILTIN_GOLDEN_DIR / "math.jsonl"


@pytest.mark.parametrize("case", golden_params("math") if BUILTIN_MATH.is_file() else [])
def test_golden_builtin_math(case):
    assert_golden(case)


def test_param_ids_are_case_ids():
    params = golden_params("toy_echo", HERE / "golden" / "toy_echo.jsonl")
    assert [p.id for p in params] == ["exact", "contains", "generated-train-2", "generated-upper", "wrong"]
    assert str(params[0].values[0]) == "toy_echo:exact"


def test_failure_message_names_file_line_case_and_diff(tmp_path):
    task = {
        "id": "t",
        "env": "toy_echo",
        "task_type": "toy",
        "messages": [{"role": "user", "content": "x"}],
        "answer": "a",
    }
    path = tmp_path / "g.jsonl"
    path.write_text(json.dumps({"id": "wrong-expectation", "task": task, "response": "a", "expected": 0.25}) + "\n")
    (param,) = golden_params("toy_echo", path)
    with pytest.raises(pytest.fail.Exception) as err:
        assert_golden(param.values[0])
    assert str(err.value) == f"{path}:1 [wrong-expectation]: got 1, expected 0.25; value off by +0.75"


def test_bad_golden_file_fails_at_collection(tmp_path):
    path = tmp_path / "g.jsonl"
    path.write_text('{"id": 1}\n')
    with pytest.raises(GoldenFileError, match=r"g.jsonl:1: id: Input should be a valid string"):
        golden_params("toy_echo", path)
