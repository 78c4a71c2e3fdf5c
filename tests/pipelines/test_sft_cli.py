"""`k2post sft` / `python -m k2post_pipelines.sft`: config, data and run-dir errors are one line and exit 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from k2post.cli import main as cli_main
from k2post_pipelines.sft import main as sft_main

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "configs" / "sft_tool_use.yaml")
sys.path.insert(0, str(REPO / "tests" / "k2post" / "sft"))


def _one_line_error(capsys, prefix: str) -> str:
    """The error line (the last line of stderr; progress bars of model loading may come before it)."""
    lines = [line for line in capsys.readouterr().err.replace("\r", "\n").splitlines() if line.strip()]
    assert lines and lines[-1].startswith(prefix), lines[-3:]
    assert sum(line.startswith(prefix) for line in lines) == 1
    return lines[-1]


def test_config_errors(capsys):
    assert cli_main(["sft", CONFIG, "train.lr=1"]) == 2
    assert "train.lr: unknown key" in _one_line_error(capsys, "k2post sft: error: ")
    assert cli_main(["sft", str(REPO / "configs" / "demo.yaml")]) == 2
    assert "the command needs kind 'sft'" in _one_line_error(capsys, "k2post sft: error: ")
    assert sft_main([]) == 2 and capsys.readouterr().err == "k2post sft: error: give a CONFIG or --resume RUN_DIR\n"


def test_data_errors_name_the_row(tmp_path, capsys, tiny_qwen2_dir):
    from data_helpers import make_row, write_dataset

    rows = [
        make_row("r0", [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}], []),
        make_row("r1", [{"role": "wizard", "content": "hi"}], []),
    ]
    dataset = write_dataset(rows, tmp_path / "ds")
    overrides = [
        f"run_dir={tmp_path / 'run'}",
        f"model.path={tiny_qwen2_dir}",
        f"data.path={dataset}",
        "data.bad_rows=error",
        "data.eval_fraction=0",
        "train.eval_every=0",
    ]
    assert sft_main([CONFIG, *overrides]) == 2
    err = _one_line_error(capsys, "k2post sft: error: ")
    assert "row 1 (id r1): messages[0].role: Input should be" in err
    assert cli_main(["sft", CONFIG, *overrides[:2], f"data.path={tmp_path / 'nowhere'}"]) == 2
    assert "is not a file or directory" in _one_line_error(capsys, "k2post sft: error: ")


def test_existing_run_dir_needs_resume(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval_loss": 8.0}) + "\n")
    assert cli_main(["sft", CONFIG, f"run_dir={run_dir}"]) == 2
    assert "already holds a run" in _one_line_error(capsys, "k2post sft: error: ")
