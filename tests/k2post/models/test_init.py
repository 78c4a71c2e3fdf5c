"""Model dir init, ModelConfig validation, ensure_model and the loaders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from safetensors.torch import load_file

from k2post.chat.tokens import IM_END
from k2post.models.config import ModelConfig
from k2post.models.flavors import flavor_config
from k2post.models.init import build_model, init_model_dir, padded_vocab_size
from k2post.models.loading import ensure_model, load_causal_lm, load_tokenizer


def test_model_config_defaults_and_unknown_flavor() -> None:
    cfg = ModelConfig()
    assert (cfg.flavor, cfg.dtype, cfg.seed, cfg.vocab_size) == ("tiny-qwen2", "float32", 0, 4096)
    assert cfg.chat_format == "instruct"
    assert ModelConfig(flavor=None, path="/some/dir").flavor is None
    with pytest.raises(ValidationError, match="unknown model flavor 'tiny-gpt'.*tiny-k2, tiny-qwen2"):
        ModelConfig(flavor="tiny-gpt")


@pytest.mark.parametrize(
    "bad", [{"dtype": "float16"}, {"vocab_size": 0}, {"flavour": "tiny-k2"}, {"chat_format": "chatml"}]
)
def test_model_config_rejects_bad_values(bad: dict) -> None:
    with pytest.raises(ValidationError):
        ModelConfig(**bad)


def test_padded_vocab_size() -> None:
    assert [padded_vocab_size(n) for n in (1, 64, 65, 4108)] == [64, 64, 128, 4160]


def test_init_writes_complete_model_dir(tiny_qwen2_dir: Path) -> None:
    names = {path.name for path in tiny_qwen2_dir.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json"} <= names
    tokenizer = load_tokenizer(tiny_qwen2_dir)
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    config = json.loads((tiny_qwen2_dir / "config.json").read_text())
    generation = json.loads((tiny_qwen2_dir / "generation_config.json").read_text())
    assert config["eos_token_id"] == generation["eos_token_id"] == im_end
    assert config["pad_token_id"] == generation["pad_token_id"] == tokenizer.pad_token_id
    assert config["vocab_size"] == padded_vocab_size(len(tokenizer))
    assert not [p for p in tiny_qwen2_dir.parent.iterdir() if p.name.startswith(".")]


def test_padding_rows_are_zero() -> None:
    model = build_model(flavor_config("tiny-qwen2", 128), seed=0, num_real_tokens=100)
    for module in (model.get_input_embeddings(), model.get_output_embeddings()):
        assert torch.count_nonzero(module.weight[100:]) == 0
        assert torch.count_nonzero(module.weight[:100]) > 0


def test_same_seed_same_weights(tiny_qwen2_dir: Path, tmp_path: Path) -> None:
    rng_state = torch.random.get_rng_state()
    again = init_model_dir("tiny-qwen2", tmp_path / "again", seed=0)
    other = init_model_dir("tiny-qwen2", tmp_path / "other", seed=1)
    assert torch.equal(torch.random.get_rng_state(), rng_state)
    first, second = load_file(tiny_qwen2_dir / "model.safetensors"), load_file(again / "model.safetensors")
    assert first.keys() == second.keys()
    assert all(torch.equal(first[name], second[name]) for name in first)
    third = load_file(other / "model.safetensors")
    assert not torch.equal(first["model.layers.0.mlp.up_proj.weight"], third["model.layers.0.mlp.up_proj.weight"])


def test_overwrite_guard(tmp_path: Path) -> None:
    out_dir = tmp_path / "model"
    out_dir.mkdir()
    (out_dir / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        init_model_dir("tiny-qwen2", out_dir)
    assert (out_dir / "notes.txt").read_text() == "keep me"
    init_model_dir("tiny-qwen2", out_dir, overwrite=True)
    assert (out_dir / "config.json").is_file() and not (out_dir / "notes.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_empty_out_dir_is_filled(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    assert (init_model_dir("tiny-qwen2", tmp_path / "model") / "config.json").is_file()


def test_ensure_model_returns_existing_dir(tiny_qwen2_dir: Path) -> None:
    mtime = (tiny_qwen2_dir / "model.safetensors").stat().st_mtime_ns
    cfg = ModelConfig(flavor="tiny-k2", path=str(tiny_qwen2_dir))
    assert ensure_model(cfg) == tiny_qwen2_dir
    assert (tiny_qwen2_dir / "model.safetensors").stat().st_mtime_ns == mtime


def test_ensure_model_builds_from_flavor(tmp_path: Path) -> None:
    cfg = ModelConfig(flavor="tiny-qwen2", path=str(tmp_path / "a" / "b"), seed=3)
    path = ensure_model(cfg)
    model = load_causal_lm(path, dtype="bfloat16")
    assert model.dtype == torch.bfloat16 and model.config.model_type == "qwen2"


def test_ensure_model_without_flavor_explains(tmp_path: Path) -> None:
    cfg = ModelConfig(flavor=None, path=str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="model.flavor is null.*tiny-k2.*HF model dir"):
        ensure_model(cfg)


def test_loaders_reject_non_model_dirs(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a directory"):
        load_causal_lm(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_tokenizer(tmp_path)
    with pytest.raises(ValueError, match="dtype"):
        load_causal_lm(tmp_path, dtype="float16")


def test_ensure_model_builds_the_asked_chat_format(tmp_path: Path, capsys) -> None:
    """`model.chat_format: thinking` (and `k2post model init --chat-format thinking`) give K2-Thinking's template."""
    from k2post.chat.template import chat_format
    from k2post_pipelines.model import main

    path = ensure_model(ModelConfig(path=str(tmp_path / "thinking"), chat_format="thinking", vocab_size=512))
    assert chat_format(load_tokenizer(path)) == "thinking"
    out = tmp_path / "cli"
    assert (
        main(["init", "--flavor", "tiny-qwen2", "--out", str(out), "--vocab-size", "512", "--chat-format", "thinking"])
        == 0
    )
    assert chat_format(load_tokenizer(out)) == "thinking"
    assert main(["init", "--flavor", "tiny-qwen2", "--out", str(tmp_path / "x"), "--chat-format", "chatml"]) == 2
