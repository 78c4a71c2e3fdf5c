"""Model directories that cannot load are one line naming the file: no weights, a truncated or damaged
safetensors file, a missing indexed shard, a path that is a file or has no config.json — checked before
transformers or vLLM would fail with a traceback (`k2post sft` and `k2post eval` included)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from k2post.models.config import ModelConfig
from k2post.models.loading import ensure_model, load_causal_lm
from k2post.models.weights import check_weights


def _model_dir(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    save_file({"w": torch.zeros(64, 64), "b": torch.ones(64)}, str(model / "model.safetensors"))
    return model


def test_whole_weights_pass(tmp_path):
    check_weights(_model_dir(tmp_path), "model.path")


HEADER_ONLY = b"\x10\x00\x00\x00\x00\x00\x00\x00" + b"not json at all!"
MISSING_SHARD = json.dumps({"weight_map": {"w": "part-2.safetensors"}})


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda m: (m / "model.safetensors").unlink(), r"no weights \(model\.safetensors"),
        (
            lambda m: _truncate(m / "model.safetensors", 1000),
            r"model\.safetensors is truncated \(1000 of 16\d+ bytes\)",
        ),
        (lambda m: _truncate(m / "model.safetensors", 5), r"model\.safetensors is truncated \(5 bytes"),
        (lambda m: (m / "model.safetensors").write_bytes(HEADER_ONLY), "has an unreadable header"),
        (
            lambda m: (m / "model.safetensors.index.json").write_text(MISSING_SHARD),
            r"the index names missing shard\(s\) \['part-2\.safetensors'\]",
        ),
    ],
)
def test_damaged_weights_are_one_line(tmp_path, damage, message):
    model = _model_dir(tmp_path)
    damage(model)
    with pytest.raises((FileNotFoundError, ValueError), match=message) as caught:
        check_weights(model, "model.path")
    assert "\n" not in str(caught.value) and str(model) in str(caught.value)
    with pytest.raises((FileNotFoundError, ValueError), match=message):
        load_causal_lm(model)


def _truncate(path: Path, size: int) -> None:
    path.write_bytes(path.read_bytes()[:size])


def test_model_path_that_is_a_file_or_has_no_config(tmp_path):
    (tmp_path / "weights.bin").write_text("x")
    with pytest.raises(FileNotFoundError, match="is a file, not a model directory"):
        ensure_model(ModelConfig(path=str(tmp_path / "weights.bin"), flavor=None))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="has no config.json, so it is not an HF model dir and model.flavor"):
        ensure_model(ModelConfig(path=str(tmp_path / "empty"), flavor=None))
    with pytest.raises(FileNotFoundError, match="does not exist and model.flavor is null"):
        ensure_model(ModelConfig(path=str(tmp_path / "nope"), flavor=None))


def test_eval_of_a_truncated_model_is_one_line_and_exit_2(tmp_path):
    model = _model_dir(tmp_path)
    _truncate(model / "model.safetensors", 1000)
    done = subprocess.run(
        [sys.executable, "-m", "k2post.cli", "eval", str(model), "--env", "math", "--n", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith(
        f"k2post eval: error: vLLM model {str(model)!r}: model.safetensors is truncated (1000 of "
    )


def test_sft_on_a_truncated_model_is_one_line_and_exit_2(tmp_path):
    model = _model_dir(tmp_path)
    _truncate(model / "model.safetensors", 1000)
    config = tmp_path / "sft.yaml"
    data = tmp_path / "chats.jsonl"
    data.write_text(
        json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})
    )
    config.write_text(
        json.dumps(
            {
                "kind": "sft",
                "run_dir": str(tmp_path / "run"),
                "model": {"path": str(model)},
                "data": {"path": str(data)},
            }
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "k2post.cli", "sft", str(config)], capture_output=True, text=True, timeout=300
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and lines, done.stderr[-2000:]
    assert lines[-1].startswith(f"k2post sft: error: model.path {str(model)!r}: model.safetensors is truncated"), lines
    assert not any("Traceback" in line for line in lines), done.stderr[-2000:]
