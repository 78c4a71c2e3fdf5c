"""Code gym: data and splits, code extraction, harness parsing, sandboxed scoring, robustness, golden file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k2post_environments.code import BUILTIN_DATA, CodeEnv, extract_code, load_rows, parse_harness
from k2post.envs.splits import hash_split as split_of
from k2post.envs.base import Task
from k2post.envs.pytest_plugin import golden_test
from k2post.envs.registry import make_environment
from k2post.envs.workers import RewardPool

GOLDEN = Path(__file__).resolve().parents[2] / "environments" / "golden" / "code.jsonl"
ROWS = load_rows(str(BUILTIN_DATA))
F = "```"

test_golden_code = golden_test("code", str(GOLDEN))


@pytest.fixture(scope="module")
def env() -> CodeEnv:
    made = make_environment("code")
    assert isinstance(made, CodeEnv)
    return made


def _task(env: CodeEnv, row_id: str) -> Task:
    return env.make_task(next(row for row in ROWS if row["id"] == row_id))


# ---------------------------------------------------------------- data and splits


def test_builtin_data_is_sound() -> None:
    assert len(ROWS) >= 30
    for row in ROWS:
        assert row["entry_point"] in row["solution"] and len(row["tests"]) >= 3
        assert all(test.startswith("assert ") for test in row["tests"])


def test_splits_disjoint_deterministic_and_cover_the_data(env: CodeEnv) -> None:
    train = [t.id for t in env.tasks("train", seed=0)]
    test = [t.id for t in env.tasks("test", seed=0)]
    dev = [t.id for t in env.tasks("dev", seed=0)]
    assert train and test and dev and not set(train) & set(test) and not set(dev) & set(train + test)
    assert len(train) + len(test) + len(dev) == len(ROWS)
    assert train == [t.id for t in env.tasks("train", seed=0)]
    assert train != [t.id for t in env.tasks("train", seed=1)]
    assert sorted(train) == sorted(t.id for t in env.tasks("train", seed=1))
    assert [t.id for t in env.tasks("train", seed=0, n=3)] == train[:3]


@pytest.mark.parametrize("task_id", ["reverse_string", "fizzbuzz", "x" * 100])
def test_split_of_is_a_pure_function(task_id: str) -> None:
    assert split_of(task_id, 0.2, 0.1) == split_of(task_id, 0.2, 0.1)
    assert split_of(task_id, 0.0, 0.0) == "train" and split_of(task_id, 1.0, 0.0) == "test"


def test_task_shape(env: CodeEnv) -> None:
    task = _task(env, "fizzbuzz")
    assert (task.env, task.task_type, task.id) == ("code", "code", "code-fizzbuzz")
    content = task.messages[0].content or ""
    assert task.answer["tests"][0] in content and task.answer["tests"][1] not in content
    reference = next(row["solution"] for row in ROWS if row["id"] == "fizzbuzz")
    assert reference not in json.dumps(task.model_dump(mode="json"), ensure_ascii=False)
    Task.model_validate_json(task.model_dump_json())


# ---------------------------------------------------------------- extraction and parsing


@pytest.mark.parametrize(
    ("response", "code", "how"),
    [
        (f"{F}python\nA\n{F} text {F}python\nB\n{F}", "B\n", "python_fence"),
        (f"{F}py\nA\n{F}", "A\n", "python_fence"),
        (f"{F}python\nA\n{F}\n{F}\nB\n{F}", "A\n", "python_fence"),
        (f"{F}\nB\n{F}", "B\n", "plain_fence"),
        (f"{F}bash\nls\n{F}", f"{F}bash\nls\n{F}", "whole_response"),
        ("def f(): pass", "def f(): pass", "whole_response"),
        (f"<think>{F}python\nA\n{F}</think>{F}python\nB", "B", "python_fence"),
        ("", "", "whole_response"),
    ],
)
def test_extract_code(response: str, code: str, how: str) -> None:
    assert extract_code(response) == (code, how)


@pytest.mark.parametrize(
    ("stdout", "expected"),
    [
        ('N {"step": "load", "ok": true}\nN {"step": 0, "ok": true}\n', {"load": True, "0": True}),
        ('{"step": 0, "ok": true}\nM {"step": 1, "ok": true}\n', {}),
        ('N {"step": 0, "ok": tru\nN [1, 2]\nN "x"\nN {"nostep": 1}\n', {}),
        ("N " + "{" * 10000 + "\n\x00\ufffd", {}),
        ('N {"step": 0, "ok": false}\nN {"step": 0, "ok": true}\n', {"0": False}),
    ],
    ids=["good", "no-nonce", "garbled", "deep-junk", "first-wins"],
)
def test_parse_harness_is_defensive(stdout: str, expected: dict[str, bool]) -> None:
    records = parse_harness(stdout, "N")
    assert {step: record.get("ok") for step, record in records.items()} == expected


# ---------------------------------------------------------------- scoring in the sandbox


@pytest.mark.parametrize("row", ROWS, ids=[row["id"] for row in ROWS])
def test_reference_solutions_score_one(env: CodeEnv, row: dict) -> None:
    reward = env.score(env.make_task(row), f"Solution:\n{F}python\n{row['solution']}{F}")
    assert reward.value == 1.0, reward.info
    assert reward.info["sandbox"] == "ok" and reward.error is None


@pytest.mark.parametrize(
    "response",
    [
        "x" * 1_000_000,
        f"{F}python\n" + "é∑😀\u200b" * 20_000 + f"\n{F}",
        "\ud800\udfff junk \x00\x01 " * 100,
        f"{F}python\n" * 500,
        f"{F}python\nimport os\nos.kill(os.getpid(), 9)\n{F}",
        f"{F}python\nprint('A' * 10_000_000)\n{F}",
        f"{F}python\nimport sys\nsys.stdout.write('\\x00' * 1000)\n{F}",
        f"{F}python\nraise MemoryError\n{F}",
    ],
    ids=["1MB", "unicode", "surrogates", "fences-only", "self-kill", "huge-print", "nul-bytes", "memoryerror"],
)
def test_any_response_gives_a_bounded_reward(env: CodeEnv, response: str) -> None:
    reward = env.score(_task(env, "reverse_string"), response)
    assert 0.0 <= reward.value <= 1.0 and reward.value == 0.0
    json.dumps(reward.model_dump())


def test_all_or_nothing_and_breakdown() -> None:
    strict = make_environment("code", {"all_or_nothing": True})
    lenient = make_environment("code")
    assert isinstance(strict, CodeEnv) and isinstance(lenient, CodeEnv)
    task = _task(lenient, "is_palindrome")
    response = f"{F}python\ndef is_palindrome(s):\n    return s.startswith('r')\n{F}"
    partial = lenient.score(task, response)
    assert partial.value == 0.5 and partial.breakdown == {"test_0": 1.0, "test_1": 1.0, "test_2": 0.0, "test_3": 0.0}
    assert strict.score(task, response).value == 0.0


def test_step_timeout_keeps_earlier_results(env: CodeEnv) -> None:
    response = f"{F}python\ndef reverse_string(s):\n    while s == '':\n        pass\n    return s[::-1]\n{F}"
    reward = env.score(_task(env, "reverse_string"), response)
    assert reward.breakdown == {"test_0": 1.0, "test_1": 0.0, "test_2": 1.0}
    assert reward.info["timed_out"] and "timeout" in reward.info["test_errors"]["1"]


def test_scoring_failures_become_errors(env: CodeEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = Task(id="x", env="code", task_type="code", messages=[], answer=None)
    assert env.score(broken, "def f(): pass").error is not None

    def explode(*args: object, **kwargs: object) -> None:
        raise RuntimeError("sandbox down")

    monkeypatch.setattr(env.sandbox, "run_python", explode)
    reward = env.score(_task(env, "sum_list"), "def sum_list(x): return sum(x)")
    assert reward.value == 0.0 and "sandbox down" in (reward.error or "")


def test_scoring_through_the_reward_pool() -> None:
    env = make_environment("code")
    assert isinstance(env, CodeEnv)
    task = _task(env, "gcd")
    good = f"{F}python\nimport math\ndef gcd(a, b):\n    return math.gcd(a, b)\n{F}"
    with RewardPool(num_workers=1, timeout_s=20.0) as pool:
        rewards = pool.score_batch([("code", {}, task, good), ("code", {}, task, "nope")])
    assert [r.value for r in rewards] == [1.0, 0.0] and all(r.error is None for r in rewards)


def test_a_test_the_trusted_side_cannot_split_is_a_load_error(tmp_path) -> None:
    path = tmp_path / "tasks.jsonl"
    row = {"id": "t", "prompt": "p", "tests": ["assert f(1) == 1", "x = f(2)"], "entry_point": "f"}
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=r"tasks\.jsonl:1: tests\[1\]: a test must be one `assert EXPR` statement"):
        load_rows(str(path))


def test_fence_extraction_is_linear_on_fence_floods() -> None:
    import time

    for flood in ("```" * 100_000, "```python" * 30_000, "```x\n" * 100_000):
        started = time.process_time()
        extract_code(flood)
        assert time.process_time() - started < 0.5
