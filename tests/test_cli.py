"""`k2post model` / `k2post config` through the `k2post` command: model init, config show, one-line errors."""

from __future__ import annotations

import pytest
import yaml

from k2post.cli import main

DEMO = "configs/demo.yaml"


def test_config_show_fills_defaults(capsys):
    assert main(["config", "show", DEMO, "sampling.max_tokens=7"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["kind"] == "demo"
    assert shown["sampling"]["max_tokens"] == 7
    assert shown["engine"]["enforce_eager"] is True  # default filled in


@pytest.mark.parametrize(
    "args, expected",
    [
        (
            ["config", "show", DEMO, "sampling.temprature=0.5"],
            "sampling.temprature: unknown key (did you mean 'temperature'?)",
        ),
        (
            ["config", "show", DEMO, "engine.dtype=fp8"],
            "engine.dtype: Input should be 'float32' or 'bfloat16' (got 'fp8')",
        ),
        (["config", "show", "configs/nope.yaml"], "configs/nope.yaml: config file not found"),
        (["config", "show", DEMO, "oops"], "override 'oops': expected the form key.path=value"),
        (["model", "init", "--flavor", "tiny-gpt9", "--out", "unused"], "tiny-gpt9"),
    ],
)
def test_errors_are_one_line(capsys, args, expected):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"k2post {args[0]}: error: ") and expected in err
    assert err.count("\n") == 1


def test_model_init_and_refuse_overwrite(tmp_path, capsys):
    out = tmp_path / "m"
    assert main(["model", "init", "--flavor", "tiny-qwen2", "--out", str(out)]) == 0
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    assert main(["model", "init", "--flavor", "tiny-qwen2", "--out", str(out)]) == 2
    assert "overwrite" in capsys.readouterr().err


def test_model_flavors_lists_them_all(capsys):
    assert main(["model", "flavors"]) == 0
    assert capsys.readouterr().out.split() == ["nano-qwen2", "qwen2-0.5b", "tiny-k2", "tiny-qwen2"]
