"""`k2post critic pairs` (pipelines/critic.py): its flags are an eval request (K samples each); one-line errors."""

from __future__ import annotations

from pathlib import Path

from k2post.cli import main
from k2post.evaluation.request import build_eval_config
from k2post_pipelines.critic import build_parser
from k2post_pipelines.eval import request_from_args


def _model_dir(path: Path) -> Path:
    path.mkdir()
    (path / "config.json").write_text("{}")
    return path


def test_flags_are_an_eval_request_with_k_samples_per_task(tmp_path):
    model = _model_dir(tmp_path / "m")
    args = build_parser().parse_args(["pairs", str(model), "--env", "math", "--k", "4", "--n", "6", "--out", "p.jsonl"])
    cfg = build_eval_config(request_from_args(args, samples=args.k, out="-"))
    assert (cfg.samples_per_task, cfg.temperature, cfg.n, cfg.split) == (4, 1.0, 6, "test")
    assert [e.name for e in cfg.envs] == ["math"] and args.out == "p.jsonl"


def test_errors_are_one_line(tmp_path, capsys):
    assert main(["critic", "pairs", str(tmp_path / "nope"), "--out", "p.jsonl"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("k2post critic: error: ") and "is not a directory" in err and err.count("\n") == 1
    model = _model_dir(tmp_path / "m")
    assert main(["critic", "pairs", str(model), "--env", "math", "--temperature", "0", "--out", "p.jsonl"]) == 2
    assert "temperature > 0" in capsys.readouterr().err
