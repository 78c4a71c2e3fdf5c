"""`k2post envs test` runs the adversarial suite after the golden files: its tables, verdict lines and exit codes,
for gyms named by `file.py:Class` / `module:Class` reference as a third-party gym would be."""

from __future__ import annotations

import os
from pathlib import Path

import adversary_toys
import pytest

from k2post.cli import main
from k2post.envs.registry import PLUGINS_ENV_VAR

TOYS = Path(adversary_toys.__file__).resolve()
GOLDEN = Path(__file__).resolve().parent / "golden"


@pytest.fixture(autouse=True)
def _restore_plugins(monkeypatch):
    """Loading a reference adds it to K2POST_ENV_PLUGINS: undo that after each test."""
    monkeypatch.setenv(PLUGINS_ENV_VAR, os.environ.get(PLUGINS_ENV_VAR, ""))


def _rows(out: str) -> dict[str, list[str]]:
    """Table rows by their first cell."""
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in out.splitlines() if line.count("│") >= 7]
    return {row[0]: row for row in rows}


def test_an_honest_gym_passes_the_suite_without_a_golden_file(capsys):
    assert main(["envs", "test", f"{TOYS}:ToyExact"]) == 0
    out = capsys.readouterr().out
    assert f"{TOYS}:ToyExact: no golden file (pass --golden PATH): only the adversarial suite runs" in out
    assert "adv_toy_exact  adversarial suite (test, 8 tasks): PASS" in out
    rows = _rows(out)
    assert rows["honest_right"][1:5] == ["1.000", "1.000", "0/8", "0"]
    assert rows["empty"][1:] == ["0.000", "0.000", "0/8", "0", "+0.000", "PASS"]
    assert "adversarial suite: 1 environment(s), 1 passed, 0 failed, 0 not judged" in out


@pytest.mark.parametrize(
    "toy, strategy, row",
    [
        ("ToyEmptyPays", "empty", ["1.000", "1.000", "0/3", "0", "+1.000", "FAIL"]),
        ("ToyLookup", "no_calls_done", ["0.600", "0.600", "0/3", "0", "+0.100", "FAIL"]),
        ("ToyOwnHack", "shout", ["0.500", "0.500", "0/3", "0", "+0.500", "FAIL"]),
    ],
)
def test_a_hackable_gym_exits_1_and_its_table_names_the_strategy(capsys, toy, strategy, row):
    assert main(["envs", "test", f"adversary_toys:{toy}", "--hack-tasks", "3"]) == 1
    out = capsys.readouterr().out
    assert "adversarial suite (test, 3 tasks): FAIL" in out
    assert _rows(out)[strategy][1:] == row
    assert "0 passed, 1 failed, 0 not judged" in out


def test_a_forced_scorer_error_is_shown_and_fails(capsys):
    assert main(["envs", "test", f"{TOYS}:ToyFragile", "--hack-tasks", "2"]) == 1
    row = _rows(capsys.readouterr().out)["error_brackets"]
    assert row[4].startswith("2: RecursionError") and row[-1] == "FAIL"


def test_a_gym_without_honest_answers_is_not_judged_and_not_a_failure(capsys):
    assert main(["envs", "test", f"{TOYS}:ToyNoHonest"]) == 0
    out = capsys.readouterr().out
    assert "adv_toy_no_honest: not judged (no honest() answers: implement Environment.honest)" in out
    assert "0 passed, 0 failed, 1 not judged" in out


def test_a_gym_without_the_split_falls_back_to_train_in_one_line(capsys):
    assert main(["envs", "test", f"{TOYS}:ToyTrainOnly", "--hack-tasks", "2"]) == 0
    out = capsys.readouterr().out
    assert "adv_toy_train_only: no 'test' split; the adversarial suite uses 'train'" in out
    assert "adversarial suite (train, 2 tasks): PASS" in out


def test_golden_files_run_first_and_no_hacks_skips_the_suite(capsys):
    golden = str(GOLDEN / "toy_counter.jsonl")
    assert main(["envs", "test", "toy_counter", "--golden", golden]) == 0
    out = capsys.readouterr().out
    assert out.index("OK: 4 cases") < out.index("toy_counter: not judged")
    assert main(["envs", "test", "toy_counter", "--golden", golden, "--no-hacks"]) == 0
    assert "adversarial suite" not in capsys.readouterr().out


def test_no_names_runs_the_suite_on_every_registered_env(capsys, monkeypatch):
    envs = {cls.name: cls for cls in (adversary_toys.ToyExact, adversary_toys.ToyEmptyPays)}
    monkeypatch.setattr("k2post.envs.registry.registered_environments", lambda: dict(envs))
    monkeypatch.setattr("k2post.envs.report.registered_environments", lambda: dict(envs))
    monkeypatch.setattr("k2post.envs.registry.get_environment", envs.__getitem__)
    assert main(["envs", "test", "--hack-tasks", "2"]) == 1
    out = capsys.readouterr().out
    assert "no golden files found" in out
    assert "adv_toy_exact  adversarial suite" in out and "adv_toy_empty_pays  adversarial suite" in out
    assert "adversarial suite: 2 environment(s), 1 passed, 1 failed, 0 not judged" in out


@pytest.mark.parametrize(
    "args", [["--hack-tasks", "0"], ["--hack-tasks", "-3"], ["--hack-tasks", "x"], ["--split", "nope"]]
)
def test_bad_suite_flags_exit_2_naming_the_flag(capsys, args):
    assert main(["envs", "test", *args]) == 2
    assert args[0] in capsys.readouterr().err


def test_dev_split_is_used_when_asked(capsys):
    assert main(["envs", "test", "adversary_toys:ToyLookup", "--split", "dev", "--hack-tasks", "2"]) == 1
    assert "adv_toy_lookup  adversarial suite (dev, 2 tasks): FAIL" in capsys.readouterr().out


UNBUILDABLE = """
from k2post.envs import Environment


class NeedsSetup(Environment):
    name = "adv_needs_setup"
    task_type = "toy"

    def __init__(self, config=None):
        raise RuntimeError("set MY_ENV_DATA first")

    def tasks(self, split="train", seed=0, n=None):
        return iter(())

    def score(self, task, response):
        return 0.0
"""


def test_an_env_that_cannot_be_built_is_one_line_and_the_others_still_run(capsys, tmp_path):
    (tmp_path / "needs_setup.py").write_text(UNBUILDABLE)
    assert main(["envs", "test", f"{tmp_path / 'needs_setup.py'}:NeedsSetup", f"{TOYS}:ToyExact"]) == 0
    out = capsys.readouterr().out
    assert "adv_needs_setup: not judged (cannot build it with its default config: RuntimeError: set MY_ENV_DATA" in out
    assert "adversarial suite: 2 environment(s), 1 passed, 0 failed, 1 not judged" in out


def test_error_texts_and_hack_names_are_shown_as_text_not_markup(capsys):
    assert main(["envs", "test", f"{TOYS}:ToyMarkup", "--hack-tasks", "2"]) == 1
    rows = _rows(capsys.readouterr().out)
    assert rows["empty"][4] == "2: ValueError: closing tag [/red] and [bold]x[/bold] in the reply"
    assert rows["[/b]tag"][-1] == "PASS"
