"""`k2post envs list|test` (pipelines/envs.py): tables, exit codes 0/1/2, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k2post.cli import main

GOLDEN = Path(__file__).resolve().parent / "golden"
TASK = {"id": "t", "env": "toy_echo", "task_type": "toy", "messages": [{"role": "user", "content": "x"}], "answer": "a"}


def test_list_shows_envs_with_their_properties(capsys):
    assert main(["envs", "list"]) == 0
    out = capsys.readouterr().out
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") >= 6}
    counter = [cell.strip() for cell in rows["toy_counter"].split("│")[1:-1]]
    assert counter == ["toy_counter", "tool", "multi (≤4)", "[-1, 1]", "1", "k2post_toy_envs"]
    assert [c.strip() for c in rows["toy_echo"].split("│")[1:-1]][2:5] == ["single", "[0, 1]", "0"]


@pytest.mark.parametrize("isolated", [[], ["--isolated"]])
def test_passing_golden_file_exits_0(capsys, isolated):
    assert main(["envs", "test", "toy_counter", "--golden", str(GOLDEN / "toy_counter.jsonl"), *isolated]) == 0
    out = capsys.readouterr().out
    assert out.count("PASS") == 4 and "OK: 4 cases in 1 environment(s), 4 passed, 0 failed" in out


def test_failing_case_exits_1_with_diff(capsys, tmp_path):
    path = tmp_path / "g.jsonl"
    lines = [
        {"id": "good", "task": TASK, "response": "a", "expected": 1},
        {"id": "bad", "task": TASK, "response": "b", "expected": 1},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines))
    assert main(["envs", "test", "toy_echo", "--golden", str(path)]) == 1
    out = capsys.readouterr().out
    bad = next(line for line in out.splitlines() if "│ bad" in line)
    assert "FAIL" in bad and "-1" in bad and "value off by -1" in bad
    assert "FAILED: 2 cases in 1 environment(s), 1 passed, 1 failed" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["envs", "test", "toy_ecko"], "unknown environment 'toy_ecko' (did you mean 'toy_echo'?)"),
        (["envs", "test", "toy_echo", "--no-hacks"], "no golden file for 'toy_echo' (pass --golden PATH)"),
        (
            ["envs", "test", "toy_echo", "toy_counter", "--golden", "x.jsonl"],
            "--golden needs exactly one environment NAME",
        ),
        (["envs", "test", "toy_echo", "--golden", "nope.jsonl"], "nope.jsonl: golden file not found"),
    ],
)
def test_errors_exit_2_with_one_line(capsys, args, message):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("k2post envs: error: ") and message in err and err.count("\n") == 1


def test_malformed_golden_exits_2(capsys, tmp_path):
    path = tmp_path / "g.jsonl"
    path.write_text(json.dumps({"id": "a", "task": TASK, "response": "a", "expected": 1}) + "\n{oops\n")
    assert main(["envs", "test", "toy_echo", "--golden", str(path)]) == 2
    assert f"{path}:2: invalid JSON" in capsys.readouterr().err


def test_no_names_runs_every_env_with_a_golden_file(capsys):
    code = main(["envs", "test", "--no-hacks"])  # the suite on every env: tests/k2post/envs/test_adversary_cli.py
    out = capsys.readouterr().out
    assert code in (0, 1)
    assert "no golden files found" in out or "environment(s)" in out


def test_isolated_timeout_flag_reports_hangs(capsys, tmp_path):
    task = {**TASK, "env": "toy_faulty"}
    path = tmp_path / "g.jsonl"
    path.write_text(json.dumps({"id": "hang", "task": task, "response": "hang", "expected": 1}) + "\n")
    args = ["envs", "test", "toy_faulty", "--golden", str(path), "--isolated", "--workers", "1", "--timeout", "0.5"]
    assert main(args) == 1
    assert "timeout after 0.5s" in capsys.readouterr().out


BOOM_ENV = """
from typing import ClassVar
from k2post.envs.base import Environment, Task

class BoomEnv(Environment):
    name: ClassVar[str] = "boom_plugin"
    task_type: ClassVar[str] = "chat"

    def tasks(self, split="train", seed=0, n=None):
        for i in range(n or 3):
            yield Task(id=f"t{i}", env=self.name, task_type="chat", messages=[{"role": "user", "content": "hi"}])

    def score(self, task, response):
        raise RuntimeError(f"scorer exploded on {task.id}")
"""


@pytest.mark.parametrize("isolated", [[], ["--isolated"]])
def test_a_file_plugin_is_tested_by_reference_and_its_errors_are_shown(capsys, tmp_path, isolated):
    source = BOOM_ENV.replace("boom_plugin", f"boom_plugin_{len(isolated)}")  # one env name per file
    (tmp_path / "boom.py").write_text(source)
    golden = tmp_path / "boom.jsonl"
    golden.write_text(json.dumps({"id": "a", "task": {"seed": 0, "split": "train", "index": 1}, "response": "x",
                                  "expected": 0.0}) + "\n")  # fmt: skip
    assert main(["envs", "test", f"{tmp_path / 'boom.py'}:BoomEnv", "--golden", str(golden), *isolated]) == 1
    out = capsys.readouterr().out
    assert "scoring error; RuntimeError: scorer exploded on t1" in out
