"""`make demo`'s job end to end: build the model, chat through vLLM, compare with transformers."""

from __future__ import annotations

import json

import pytest

from k2post.config.registry import load_run_config
from k2post_pipelines.demo import run_demo


@pytest.mark.slow
def test_demo_runs_and_matches_transformers(tmp_path, tiny_qwen2_dir):
    cfg = load_run_config(
        "configs/demo.yaml",
        [f"model.path={tiny_qwen2_dir}", f"run_dir={tmp_path / 'run'}", "sampling.max_tokens=12"],
        expected_kind="demo",
    )
    summary = run_demo(cfg)
    assert summary["greedy_match_transformers"] is True
    rows = [json.loads(line) for line in (tmp_path / "run" / "generations.jsonl").read_text().splitlines()]
    assert len(rows) == len(cfg.prompts)
    assert all(row["token_ids"] for row in rows)
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["generated_tokens"] > 0
