"""`k2post judge eval` refuses counts that would run for hours (`--entities 1000000000` hung) before building
anything: one line, exit 2."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--entities", "1000000000"], "--entities must be in [3, 10,000], got 1,000,000,000"),
        (["--entities", "0"], "--entities must be in [3, 10,000], got 0"),
        (["--pairs", "1000000000"], "--pairs must be in [2, 50,000], got 1,000,000,000"),
        (["--pairs", "-1"], "--pairs must be in [2, 50,000], got -1"),
    ],
)
def test_eval_counts_out_of_bounds_are_one_line(tmp_path, capsys, monkeypatch, argv, message):
    from k2post_pipelines import judge

    def never(*args):
        raise AssertionError("built a corpus")

    monkeypatch.setattr(judge, "held_out_report", never)
    assert judge.main(["eval", str(tmp_path), *argv]) == 2
    assert capsys.readouterr().err == f"k2post judge: error: {message}\n"
