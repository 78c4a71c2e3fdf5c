"""Bad input to `k2post model prepare / export / stats` is one line and exit 2, never a traceback, a hang or lost
data: absurd config values, damaged or dangling weights, an output dir that is, holds or lies in the source."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from k2post.models.config_check import config_problem
from k2post.models.outdir import OutDirError, check_out_dir, staged_dir
from k2post.models.weights import check_fits_in_memory, check_weights

QWEN = {"model_type": "qwen2", "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2}
QWEN |= {"num_hidden_layers": 4, "vocab_size": 4096, "intermediate_size": 512}


@pytest.mark.parametrize(
    ("update", "problem"),
    [
        ({}, None),
        ({"hidden_size": 1e12}, "hidden_size must be an integer, got float"),
        ({"hidden_size": 10**12}, "hidden_size must be in [1, 262,144], got 1,000,000,000,000"),
        ({"num_attention_heads": 0}, "num_attention_heads must be in [1,"),
        ({"vocab_size": -5}, "vocab_size must be in [1,"),
        ({"hidden_size": "big"}, "hidden_size must be an integer, got str 'big'"),
        ({"hidden_size": True}, "hidden_size must be an integer, got bool"),
        ({"hidden_size": None}, "hidden_size must be an integer, got null"),
        ({"num_key_value_heads": None, "head_dim": None}, None),  # nullable: transformers derives them
        ({"num_hidden_layers": 10**9}, "num_hidden_layers must be in [1, 4,096]"),
        ({"num_key_value_heads": 0}, "num_key_value_heads must be in [1,"),
        ({"hidden_size": 250}, "num_attention_heads 4 does not divide hidden_size 250"),
        ({"hidden_size": 250, "head_dim": 64}, None),
        ({"num_key_value_heads": 3}, "num_key_value_heads 3 does not divide num_attention_heads 4"),
        ({"num_experts": 4, "num_experts_per_tok": 8}, "num_experts_per_tok 8 is more than the 4 routed experts"),
        ({"num_experts": 0}, "num_experts must be in [1,"),
        ({"num_hidden_layers": 4096, "num_experts": 4096}, "expert blocks"),
        ({"n_embd": -1}, "n_embd must be in [1,"),
    ],
)
def test_config_problems(update, problem):
    found = config_problem({**QWEN, **update})
    assert found == problem if problem is None else problem in found


def test_published_configs_pass():
    from k2post.models.stats import deepseek_v3_config, kimi_k2_config

    for config in (kimi_k2_config(), deepseek_v3_config()):
        assert config_problem(config.to_dict()) is None


def _model_dir(root: Path) -> Path:
    """A dir that passes the pre-load checks: config, a tokenizer vocabulary, one whole safetensors file."""
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(QWEN))
    (root / "tokenizer.json").write_text("{}")
    _safetensors(root / "model.safetensors", {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}, 16)
    return root


def _safetensors(path: Path, header: dict, data_bytes: int) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)
    os.truncate(path, 8 + len(raw) + data_bytes)  # sparse: a huge file costs no disk


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: os.symlink(d / "gone", d / "w.safetensors"), "w.safetensors is not a readable file"),
        (lambda d: os.symlink(d / "w.safetensors", d / "w.safetensors"), "w.safetensors is not a readable file"),
        (lambda d: os.symlink(d, d / "w.safetensors"), "w.safetensors is not a readable file"),
        (
            lambda d: _safetensors(
                d / "w.safetensors", {"w": {"dtype": "F32", "shape": [10**9, 10**9], "data_offsets": [0, 4]}}, 4
            ),
            "shape [1000000000, 1000000000] F32 does not match data_offsets [0, 4]",
        ),
        (lambda d: _safetensors(d / "w.safetensors", {"w": {"dtype": "F32", "shape": "x"}}, 4), "has a bad shape"),
        (lambda d: _safetensors(d / "w.safetensors", {"w": [1]}, 4), "has no dtype"),
    ],
)
def test_weights_that_cannot_load_are_one_line(tmp_path, damage, message):
    damage(tmp_path)
    with pytest.raises(ValueError, match="HF_DIR") as err:
        check_weights(tmp_path, "HF_DIR")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_weights_larger_than_memory_are_refused(tmp_path, monkeypatch):
    n = 200_000 * 200_000 * 4  # 160 GB, sparse
    _safetensors(
        tmp_path / "model.safetensors",
        {"w": {"dtype": "F32", "shape": [200_000, 200_000]} | {"data_offsets": [0, n]}},
        n,
    )
    check_weights(tmp_path, "HF_DIR")  # whole ...
    monkeypatch.setattr("k2post.models.weights.available_memory", lambda: 64 << 30)
    with pytest.raises(ValueError, match=r"needs 149.0 GiB, 64.0 GiB of memory is available"):
        check_fits_in_memory(tmp_path, "HF_DIR")  # ... but not loadable here


@pytest.mark.parametrize(
    ("out", "overwrite", "message"),
    [
        ("src", True, "is the source dir"),
        (".", True, "contains the source"),  # the parent: --overwrite would delete the source and its siblings
        ("src/sub", True, "is inside the source"),
        ("link", True, "is the source dir"),  # a symlink to the source
        ("file", True, "exists and is not a directory"),
        ("file/x", False, "which is a file, not a directory"),
        ("taken", False, "exists and is not empty (pass --overwrite"),
        ("taken", True, None),
        ("new/deeper", False, None),
    ],
)
def test_out_dir_rules(tmp_path, monkeypatch, out, overwrite, message):
    monkeypatch.chdir(tmp_path)
    _model_dir(tmp_path / "src")
    (tmp_path / "link").symlink_to(tmp_path / "src")
    (tmp_path / "file").write_text("x")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("x")
    if message is None:
        check_out_dir(Path("src"), Path(out), overwrite, "--out")
        return
    with pytest.raises(OutDirError, match="^--out ") as err:
        check_out_dir(Path("src"), Path(out), overwrite, "--out")
    assert message in str(err.value)


def test_a_source_file_linking_into_out_is_refused(tmp_path):
    _model_dir(tmp_path / "src")
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "big.safetensors").write_text("x")
    (tmp_path / "src" / "shard.safetensors").symlink_to(tmp_path / "store" / "big.safetensors")
    with pytest.raises(OutDirError, match="holds what the source's shard.safetensors links to"):
        check_out_dir(tmp_path / "src", tmp_path / "store", True, "--out")


def test_staged_dir_replaces_out_only_when_complete(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old").write_text("old")
    with pytest.raises(RuntimeError), staged_dir(out) as tmp:
        (tmp / "new").write_text("half")
        raise RuntimeError("killed part way")
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and (out / "old").read_text() == "old"
    with staged_dir(out) as tmp:
        (tmp / "new").write_text("new")
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and [p.name for p in out.iterdir()] == ["new"]


@pytest.mark.parametrize("command", ["prepare", "export"])
@pytest.mark.parametrize("target", ["source", "parent"])
def test_overwrite_never_deletes_the_source(tmp_path, capsys, command, target):
    """`model prepare SRC --out PARENT --overwrite` deleted the source and every sibling and exited 0; `model
    export SRC --int4 SRC --overwrite` deleted the source. Both are refused, one line, and nothing is touched."""
    from k2post_pipelines.model import main

    source = _model_dir(tmp_path / "models" / "src")
    (tmp_path / "models" / "sibling").write_text("keep me")
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    out = source if target == "source" else source.parent
    flag = "--out" if command == "prepare" else "--int4"
    assert main([command, str(source), flag, str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"k2post model: error: {flag} {out}: "), err
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["export", "{src}", "--int4", "{tmp}/o", "--group-size", "0"], "--group-size must be in [1, 65,536], got 0"),
        (["export", "{src}", "--int4", "{tmp}/o", "--group-size", "-4"], "--group-size must be in [1,"),
        (["prepare", "{notok}", "--out", "{tmp}/o"], "no tokenizer vocabulary (tokenizer.json, tokenizer.model"),
        (["prepare", "{absurd}", "--out", "{tmp}/o"], "config.json: hidden_size must be in [1, 262,144]"),
        (["export", "{absurd}", "--int4", "{tmp}/o"], "config.json: hidden_size must be in [1, 262,144]"),
        (["prepare", "{src}", "--out", "{tmp}/file"], "exists and is not a directory"),
        (["stats", "{deep}"], "not a JSON config (maximum recursion depth"),
        (["stats", "--preset", "tiny-qwen2", "--context", str(10**30)], "--context must be in [1, 1,073,741,824]"),
        (["init", "--flavor", "tiny-qwen2", "--out", "{tmp}/o", "--vocab-size", "0"], "--vocab-size must be in [1,"),
    ],
)
def test_cli_bad_input_is_one_line_before_loading(tmp_path, capsys, argv, message):
    src = _model_dir(tmp_path / "src")
    notok = _model_dir(tmp_path / "notok")
    (notok / "tokenizer.json").unlink()
    absurd = _model_dir(tmp_path / "absurd")
    (absurd / "config.json").write_text(json.dumps({**QWEN, "hidden_size": 10**12}))
    (tmp_path / "file").write_text("x")
    (tmp_path / "deep").mkdir()
    (tmp_path / "deep" / "config.json").write_text("[" * 100_000)
    from k2post_pipelines.model import main

    paths = {"src": src, "notok": notok, "absurd": absurd, "tmp": tmp_path, "deep": tmp_path / "deep"}
    assert main([a.format(**paths) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("k2post model: error: ") and message in err[0], err
    assert not (tmp_path / "o").exists()


def test_an_oserror_of_a_path_is_one_line(tmp_path, capsys, monkeypatch):
    """Permission denied, a read-only or full disk when writing OUT: one line naming the path, exit 2."""
    from k2post_pipelines import model

    def denied(args):
        raise PermissionError(13, "Permission denied", str(tmp_path / "o"))

    monkeypatch.setattr(model, "_prepare", denied)
    assert model.main(["prepare", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == f"k2post model: error: {tmp_path / 'o'}: Permission denied\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--out", "{tmp}/file/x"], "--out {tmp}/file/x: lies under {tmp}/file, which is a file, not a directory"),
        (["--out", "{tmp}/file", "--overwrite"], "--out {tmp}/file: exists and is not a directory"),
        (["--out", "{tmp}/o", "--seed", str(2**70)], "--seed must be in [-9,223,372,036,854,775,808, "),
    ],
)
def test_init_bad_out_or_seed_is_one_line_before_building(tmp_path, capsys, argv, message):
    """`model init --out FILE/x` said "[Errno 17] File exists" and `--seed 2**70` "Overflow when unpacking long
    long", both after training a tokenizer."""
    from k2post_pipelines.model import main

    (tmp_path / "file").write_text("x")
    assert main(["init", "--flavor", "nano-qwen2", *(a.format(tmp=tmp_path) for a in argv)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"k2post model: error: {message.format(tmp=tmp_path)}"] or message.format(tmp=tmp_path) in err[0]
    assert len(err) == 1 and not (tmp_path / "o").exists()
