"""`k2post eval` (pipelines/eval.py; k2post/evaluation/request.py): model / run-dir resolution, env configs from
flags and run configs, one-line errors, a real run."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from k2post.config.loader import ConfigError
from k2post.evaluation.request import build_eval_config, env_configs_from, resolve_model
from k2post_pipelines.eval import build_parser, split_requests
from proc_helpers import run_bounded

REPO = Path(__file__).resolve().parents[3]


def _model_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return path


def _requests(*argv: str):
    return split_requests(build_parser().parse_args(list(argv)))


def _request(*argv: str):
    (request,) = _requests(*argv)
    return request


def test_resolve_model_dir_run_dir_and_checkpoints(tmp_path):
    model = _model_dir(tmp_path / "plain")
    assert resolve_model(str(model)) == (model, None)
    run = tmp_path / "run"
    for n in (2, 10):
        _model_dir(run / "checkpoints" / f"iter-{n}")
    (run / "config.yaml").write_text("kind: rl\n")
    assert resolve_model(str(run)) == (run / "checkpoints" / "iter-10", run)
    assert resolve_model(str(run / "checkpoints" / "iter-2")) == (run / "checkpoints" / "iter-2", run)
    _model_dir(run / "final")
    assert resolve_model(str(run)) == (run / "final", run)
    assert resolve_model(str(run / "final")) == (run / "final", run)


@pytest.mark.parametrize(
    "make,needle", [(lambda p: p, "holds no model"), (lambda p: p / "missing", "is not a directory")]
)
def test_resolve_model_errors(tmp_path, make, needle):
    with pytest.raises(FileNotFoundError, match=needle):
        resolve_model(str(make(tmp_path)))


def test_env_configs_from_run_config_or_plain_mapping():
    run = {"envs": [{"name": "math", "config": {"difficulty": 2}}, {"name": "tool_use"}]}
    assert env_configs_from(run, ["math", "tool_use"], "x") == {"math": {"difficulty": 2}, "tool_use": {}}
    assert env_configs_from(run, ["reasoning_gym"], "x") == {}
    assert env_configs_from({"difficulty": 3}, ["math"], "x") == {"math": {"difficulty": 3}}
    with pytest.raises(ConfigError, match="exactly one --env"):
        env_configs_from({"difficulty": 3}, ["math", "tool_use"], "x")


def test_run_dir_supplies_envs_budgets_and_turn_limits(tmp_path):
    run = tmp_path / "run"
    _model_dir(run / "final")
    (run / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "kind": "rl",
                "envs": [
                    {"name": "math", "config": {"difficulty": 2}},
                    {"name": "tool_use", "config": {"max_turns": 3}},
                ],
                "budget": {"default_max_tokens": 40, "max_tokens": {"math": 16}, "penalty": "replace"},
                "rollout": {"agentic": {"max_turns": 3, "max_episode_tokens": 300, "iteration_token_budget": 64}},
            }
        )
    )
    cfg = build_eval_config(_request(str(run), "--n", "5", "--seed", "7"))
    assert [e.name for e in cfg.envs] == ["math", "tool_use"] and cfg.envs[0].config["difficulty"] == 2
    assert (
        cfg.budget.budget_for("math") == 16 and cfg.budget.budget_for("tool_use") == 40 and cfg.budget.penalty == "none"
    )
    assert cfg.agentic.max_turns == 3 and cfg.agentic.iteration_token_budget is None
    assert cfg.model_path == str(run / "final") and cfg.report_path == str(run / "eval" / "math+tool_use-n5-s7.json")
    assert cfg.engine.dtype == "float32"
    bf16 = build_eval_config(_request(str(run), "--dtype", "bfloat16"))
    assert bf16.engine.dtype == "bfloat16" and bf16.engine.max_model_len == cfg.engine.max_model_len
    override = tmp_path / "math.yaml"
    override.write_text("difficulty: 4\n")
    cfg = build_eval_config(_request(str(run), "--env", "math", "--env-config", str(override), "--max-tokens", "20"))
    assert (
        [e.name for e in cfg.envs] == ["math"]
        and cfg.envs[0].config["difficulty"] == 4
        and cfg.budget.budget_for("math") == 20
    )


@pytest.mark.parametrize(
    "extra,needle",
    [
        ([], "name at least one --env"),
        (["--env", "maths"], "did you mean 'math'"),
        (["--env", "math", "--env-config", "{cfg}"], "difficulty"),
        (["--env", "math", "--samples", "4"], "temperature > 0"),
    ],
)
def test_cli_errors_are_one_line(tmp_path, extra, needle):
    model = _model_dir(tmp_path / "m")
    bad = tmp_path / "bad.yaml"
    bad.write_text("difficulty: 99\n")
    argv = [sys.executable, "-m", "k2post.cli", "eval", str(model), *[a.replace("{cfg}", str(bad)) for a in extra]]
    done = run_bounded(argv, timeout=120, cwd=REPO)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("k2post eval: error: ") and needle in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_cli_runs_on_a_run_dir_and_writes_the_report(tiny_qwen2_dir, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_qwen2_dir, run / "final")
    chain_sum = {
        "dataset": "chain_sum",
        "dataset_config": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1},
    }
    (run / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "kind": "rl",
                "envs": [{"name": "reasoning_gym", "config": chain_sum}, {"name": "math", "config": {"difficulty": 1}}],
                "budget": {"default_max_tokens": 8},
                "rollout": {"agentic": {"max_turns": 1, "max_turn_tokens": 32, "max_episode_tokens": 64}},
            }
        )
    )
    argv = [sys.executable, "-m", "k2post.cli", "eval", str(run), "--n", "4", "--seed", "2"]
    done = run_bounded([*argv, "--split", "test", "--split", "shifted"], timeout=600, cwd=REPO)  # one engine, 2 reports
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    report = json.loads((run / "eval" / "reasoning_gym+math-n4-s2.json").read_text())
    assert set(report["envs"]) == {"reasoning_gym", "math"} and all(m["n"] == 4 for m in report["envs"].values())
    assert report["env_configs"]["reasoning_gym"]["dataset"] == "chain_sum" and 0.0 <= report["mean_accuracy"] <= 1.0
    assert "reasoning_gym" in done.stdout and "mean" in done.stdout and done.stdout.count("report: ") == 2
    shifted = json.loads((run / "eval" / "reasoning_gym+math-n4-s2-shifted.json").read_text())
    assert shifted["split"] == "shifted" and all(m["n"] == 4 for m in shifted["envs"].values())
    assert {s["task"] for s in shifted["samples"]["math"]}.isdisjoint(s["task"] for s in report["samples"]["math"])


def test_a_run_config_as_env_config_supplies_budgets_for_a_plain_model(tmp_path):
    model = _model_dir(tmp_path / "sft_final")
    rl = tmp_path / "rl.yaml"
    rl.write_text(
        yaml.safe_dump(
            {
                "kind": "rl",
                "envs": [{"name": "math", "config": {"difficulty": 3}}],
                "budget": {"default_max_tokens": 30, "max_tokens": {"math": 12}},
                "rollout": {"agentic": {"max_turns": 2, "max_turn_tokens": 64, "max_episode_tokens": 200}},
            }
        )
    )
    cfg = build_eval_config(_request(str(model), "--env", "math", "--env-config", str(rl)))
    assert cfg.envs[0].config["difficulty"] == 3 and cfg.budget.budget_for("math") == 12 and cfg.agentic.max_turns == 2
    assert cfg.report_path == str(model / "eval" / "math-n64-s0.json")
    cfg = build_eval_config(_request(str(model), "--env-config", str(rl)))  # no --env: the run config's envs
    assert [e.name for e in cfg.envs] == ["math"] and cfg.envs[0].config["difficulty"] == 3


@pytest.mark.parametrize(
    "argv,split,name",
    [
        ([], "test", "math-n5-s7.json"),
        (["--split", "dev"], "dev", "math-n5-s7-dev.json"),
        (["--split", "shifted"], "shifted", "math-n5-s7-shifted.json"),
    ],
)
def test_split_flag_reaches_the_config_and_the_report_path(tmp_path, argv, split, name):
    model = _model_dir(tmp_path / "m")
    cfg = build_eval_config(_request(str(model), "--env", "math", "--n", "5", "--seed", "7", *argv))
    assert cfg.split == split and cfg.report_path == str(model / "eval" / name)


def test_several_splits_get_one_report_each(tmp_path):
    model = _model_dir(tmp_path / "m")
    flags = (str(model), "--env", "math", "--n", "5", "--split", "test", "--split", "shifted", "--split", "test")
    cfgs = [build_eval_config(request) for request in _requests(*flags)]
    assert [(c.split, Path(c.report_path).name) for c in cfgs] == [
        ("test", "math-n5-s0.json"),
        ("shifted", "math-n5-s0-shifted.json"),
    ]
    requests = _requests(*flags, "--out", str(tmp_path / "r-{split}.json"))
    assert [r.out for r in requests] == [str(tmp_path / "r-test.json"), str(tmp_path / "r-shifted.json")]
    with pytest.raises(ConfigError, match=r"--out .*several --split values \(test, shifted\) put \{split\} in it"):
        _requests(*flags, "--out", "one.json")


def test_unknown_split_flag_is_rejected(capsys):
    with pytest.raises(SystemExit):
        _request("m", "--split", "holdout")
    assert "invalid choice: 'holdout'" in capsys.readouterr().err


def test_cli_prints_reward_error_texts_then_fails_past_the_limit(tmp_path, monkeypatch, capsys):
    """`k2post eval` (in process, engine replaced by a fixed report): the error texts are on the console, the
    report is written, and a share above --max-reward-error-fraction is one line and exit status 2."""
    import k2post.evaluation.heldout as heldout
    from k2post_pipelines.eval import main

    model = _model_dir(tmp_path / "m")

    def reports(cfgs):
        report = {
            "model": str(model),
            "split": "test",
            "seed": 0,
            "mean_accuracy": 0.0,
            "envs": {
                "math": dict.fromkeys(("accuracy", "mean_reward", "truncation_rate", "response_tokens_mean"), 0.0)
            },
            "reward_error_samples": {"math": ["RuntimeError: scorer broke", "KeyError: 'x'"]},
        }
        report["envs"]["math"].update(n=4, reward_errors=3)
        heldout.write_report(Path(cfgs[0].report_path), report)
        return [report]

    monkeypatch.setattr(heldout, "evaluate_splits", reports)
    assert main([str(model), "--env", "math", "--n", "4", "--max-reward-error-fraction", "0.8"]) == 0
    out = capsys.readouterr().out
    assert "reward errors in math (3), first:" in out and "RuntimeError: scorer broke" in out and "KeyError" in out
    assert main([str(model), "--env", "math", "--n", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("k2post eval: error: test split: 3 of 4 rewards failed (75% > --max-reward-error-fraction")
    assert len(err.splitlines()) == 1 and (model / "eval" / "math-n4-s0.json").is_file()
    assert main([str(model), "--env", "math", "--max-reward-error-fraction", "2"]) == 2
    assert "max_reward_error_fraction" in capsys.readouterr().err


PLUGIN_ENV = """
from k2post.chat.types import Message
from k2post.envs import Environment, Reward, Task


class WordCount(Environment):
    name = "word_count_eval"
    task_type = "toy"

    def tasks(self, split="train", seed=0, n=None):
        for i in range(n or 2):
            yield Task(id=f"{split}-{i}", env=self.name, task_type="toy",
                       messages=[Message(role="user", content="Say three words.")], answer=3)

    def score(self, task, response):
        return Reward(value=float(len(response.split()) == task.answer))
"""


@pytest.mark.parametrize(
    "run_envs, flags",
    [
        ([{"name": "word_count_eval", "plugin": "{file}:WordCount"}], []),  # a run dir written by `k2post rl`
        ([{"name": "plugins/word_count.py:WordCount", "config": {}}], []),  # a run config as the user wrote it
        ([{"name": "math"}], ["--env", "plugins/word_count.py:WordCount"]),
        ([{"name": "math"}], ["--env", "word_count_plugin_mod:WordCount"]),
    ],
)
def test_eval_finds_the_runs_plugin_environments(tmp_path, monkeypatch, run_envs, flags):
    """`k2post eval RUN_DIR` resolves `file.py:Class` / `module:Class` envs as `k2post rl` does (relative to the
    working directory, or from the saved entry's absolute `plugin`), with the class's registered name."""
    from k2post.envs.registry import PLUGINS_ENV_VAR, registered_environments, unregister_environment

    monkeypatch.setenv(PLUGINS_ENV_VAR, "")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "plugins").mkdir()
    plugin = tmp_path / "plugins" / "word_count.py"
    plugin.write_text(PLUGIN_ENV)
    (tmp_path / "word_count_plugin_mod.py").write_text(PLUGIN_ENV)
    run = tmp_path / "run"
    _model_dir(run / "final")
    envs = [{**e, "plugin": e["plugin"].format(file=plugin)} if "plugin" in e else e for e in run_envs]
    (run / "config.yaml").write_text(yaml.safe_dump({"kind": "rl", "envs": envs}))
    unregister_environment("word_count_eval")
    assert "word_count_eval" not in registered_environments()
    try:
        cfg = build_eval_config(_request(str(run), "--n", "3", *flags))
        assert [e.name for e in cfg.envs] == ["word_count_eval"]
        assert cfg.envs[0].plugin in (f"{plugin}:WordCount", "word_count_plugin_mod:WordCount")
        assert cfg.report_path == str(run / "eval" / "word_count_eval-n3-s0.json")
        assert cfg.envs[0].plugin in os.environ[PLUGINS_ENV_VAR]  # reward workers load it too
    finally:
        unregister_environment("word_count_eval")
