"""`k2post model stats` (k2post/models/stats.py): counts from a meta-device model equal the materialized model's own,
the breakdown sums to the total, active params follow k / E, KV bytes and attention FLOPs per architecture, the
published presets land near their papers' numbers (cheaply), and the CLI's JSON and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from k2post.cli import main
from k2post.models import stats


@pytest.fixture(scope="module")
def materialized():
    """The tiny flavors as real (materialized, randomly initialized) models, by name."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return {name: AutoModelForCausalLM.from_config(stats.preset_config(name)) for name in ("tiny-qwen2", "tiny-k2")}


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-k2"])
def test_meta_counts_equal_the_materialized_model(materialized, name):
    model = materialized[name]
    result = stats.model_stats(stats.preset_config(name), context=128)
    assert result["total_params"] == sum(p.numel() for p in model.parameters())
    assert sum(result["breakdown"].values()) == result["total_params"]
    assert stats.param_breakdown(model) == result["breakdown"]  # the same walk over the live model
    assert result["breakdown"]["embeddings"] == result["breakdown"]["head"] == 4096 * model.config.hidden_size


def test_active_params_dense_and_moe(materialized):
    dense = stats.model_stats(stats.preset_config("tiny-qwen2"))
    assert dense["active_params"] == dense["total_params"]
    assert dense["breakdown"]["routed_experts"] == dense["breakdown"]["router"] == 0
    moe = stats.model_stats(stats.preset_config("tiny-k2"))
    params = dict(materialized["tiny-k2"].named_parameters())
    routed = sum(p.numel() for n, p in params.items() if ".mlp.experts." in n)
    assert routed == moe["breakdown"]["routed_experts"] > 0
    assert moe["breakdown"]["shared_experts"] == sum(p.numel() for n, p in params.items() if "shared_experts" in n)
    assert moe["active_params"] == moe["total_params"] - routed + routed * 2 // 8  # 2 of 8 experts per token
    assert moe["active_params"] < moe["total_params"]


def test_matrix_flops_count_active_matmul_weights_and_the_head(materialized):
    for name, (k, e) in (("tiny-qwen2", (1, 1)), ("tiny-k2", (2, 8))):
        params = dict(materialized[name].named_parameters())
        weights = sum(
            p.numel() * (k / e if ".mlp.experts." in n else 1)
            for n, p in params.items()
            if p.dim() >= 2 and "embed_tokens" not in n
        )
        assert stats.matrix_flops_per_token(materialized[name]) == 2 * weights


def test_tied_embeddings_are_counted_once_and_the_head_still_costs_flops():
    config = stats.preset_config("tiny-qwen2")
    config.tie_word_embeddings = True
    result = stats.model_stats(config)
    assert result["breakdown"]["head"] == 0 and result["total_params"] == 4_460_800 - 4096 * 256
    untied = stats.model_stats(stats.preset_config("tiny-qwen2"))
    assert result["flops_per_token"]["matrix"] == untied["flops_per_token"]["matrix"]


@pytest.mark.parametrize(
    ("name", "dtype", "expected"),
    [
        ("tiny-qwen2", "bf16", 2 * 2 * 64 * 4 * 2),  # K and V x 2 KV heads x head_dim 64 x 4 layers x 2 bytes
        ("tiny-qwen2", "fp32", 2 * 2 * 64 * 4 * 4),
        ("tiny-k2", "bf16", (512 + 64) * 4 * 2),  # MLA: kv_lora_rank + rope dim per layer
        ("kimi-k2", "bf16", (512 + 64) * 61 * 2),
        ("kimi-k2", "fp8", (512 + 64) * 61),
        ("deepseek-v3", "bf16", (512 + 64) * 61 * 2),
    ],
)
def test_kv_cache_bytes_per_token(name, dtype, expected):
    assert stats.kv_bytes_per_token(stats.preset_config(name), dtype) == expected


def test_unknown_kv_dtype_is_an_error():
    with pytest.raises(ValueError, match="unknown KV dtype 'int3'"):
        stats.kv_bytes_per_token(stats.preset_config("tiny-k2"), "int3")


def test_attention_flops_at_full_context_and_the_causal_average():
    k2 = stats.preset_config("kimi-k2")
    assert stats.attention_flops_per_token(k2, 4096) == 2 * 61 * 64 * 4096 * (128 + 64 + 128)
    qwen = stats.preset_config("tiny-qwen2")
    assert stats.attention_flops_per_token(qwen, 10) == 2 * 4 * 4 * 10 * (64 + 64)
    assert stats.causal_context([3]) == 2.0 and stats.causal_context([1, 1]) == 1.0
    assert stats.causal_context([2, 4]) == pytest.approx((3 + 10) / 6) and stats.causal_context([]) == 0.0


@pytest.mark.parametrize(
    ("name", "total", "active", "band"),
    [
        ("kimi-k2", 1.04e12, 32.6e9, 0.02),  # K2 report: 1.04T total, 32.6B active; we count 1.026T / 32.86B
        ("deepseek-v3", 671e9, 37e9, 0.02),  # DeepSeek-V3 report: 671B (without the 14B MTP module), 37B active
    ],
)
def test_published_presets_land_near_their_reports_in_seconds(name, total, active, band):
    started = time.perf_counter()
    result = stats.model_stats(stats.preset_config(name))
    assert time.perf_counter() - started < 20.0  # two 61-layer meta models (the config and the double-heads one)
    assert result["total_params"] == pytest.approx(total, rel=band)
    assert result["active_params"] == pytest.approx(active, rel=band)
    assert sum(result["breakdown"].values()) == result["total_params"]
    assert result["flops_per_token"]["train"] == 3 * result["flops_per_token"]["total"]


def test_double_heads_what_if():
    qwen = stats.model_stats(stats.preset_config("tiny-qwen2"))["what_if_double_heads"]
    hidden, head_dim, layers = 256, 64, 4
    # q_proj (weight + bias) and o_proj grow by 4 heads x 64; GQA K/V and the KV cache stay
    assert qwen["delta"]["total_params"] == layers * (2 * hidden * 4 * head_dim + 4 * head_dim)
    assert qwen["delta"]["kv_bytes_per_token"] == 0
    k2 = stats.model_stats(stats.preset_config("kimi-k2"))
    what_if = k2["what_if_double_heads"]
    assert what_if["num_attention_heads"] == 128
    assert what_if["delta"]["flops_per_token"]["attention"] == k2["flops_per_token"]["attention"]  # twice the heads
    assert what_if["delta"]["kv_bytes_per_token"] == 0  # MLA caches the latent, whatever the head count
    assert 0 < what_if["delta"]["total_params"] == what_if["delta"]["active_params"]  # all of it is attention


def _json(capsys, *argv: str) -> dict:
    assert main(["model", "stats", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_json_of_a_preset_a_model_dir_and_a_config_file(tmp_path, capsys):
    out = _json(capsys, "--preset", "tiny-k2", "--context", "1024")
    for key in ("total_params", "active_params", "breakdown", "flops_per_token", "kv_bytes_per_token"):
        assert key in out
    assert out["what_if_double_heads"]["delta"]["total_params"] > 0 and out["flops_per_token"]["context"] == 1024
    stats.preset_config("tiny-qwen2").to_json_file(str(tmp_path / "config.json"))
    assert _json(capsys, str(tmp_path))["total_params"] == 4_460_800
    assert _json(capsys, str(tmp_path / "config.json"))["total_params"] == 4_460_800
    assert main(["model", "stats", "--preset", "tiny-qwen2"]) == 0
    table = capsys.readouterr().out
    assert "total params" in table and "4,460,800" in table and "what if heads x2 (4 -> 8)" in table


def test_a_remote_code_config_is_read_by_its_architecture(tmp_path, capsys):
    """K2's own config.json says model_type `kimi_k2` (remote code) and architectures `DeepseekV3ForCausalLM`."""
    raw = {**stats.preset_config("tiny-k2").to_dict(), "model_type": "kimi_k2"}
    raw["architectures"] = ["DeepseekV3ForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert _json(capsys, str(tmp_path))["total_params"] == 20_205_056


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--preset", "gpt-9"], "unknown preset 'gpt-9'; known presets: kimi-k2, deepseek-v3"),
        (["{tmp}/nowhere"], "nowhere: no such model dir or config.json"),
        (["{tmp}"], ": not an HF model dir (no config.json)"),
        (["{tmp}/foo.json"], "unknown architecture (model_type 'foo' is not in transformers)"),
        (["{tmp}/t5.json"], "unknown architecture: transformers has no causal LM for 't5'"),
        (["{tmp}/bad.json"], "bad.json: not a JSON config"),
        ([], "give one of MODEL_DIR, CONFIG_JSON or --preset NAME"),
        (["--preset", "tiny-k2", "--kv-dtype", "int3"], "--kv-dtype 'int3': one of bf16"),
        (["--preset", "tiny-k2", "--context", "0"], "--context must be in [1, 1,073,741,824], got 0"),
    ],
)
def test_cli_bad_input_is_one_line(tmp_path, capsys, argv, message):
    (tmp_path / "foo.json").write_text('{"model_type": "foo"}')
    (tmp_path / "t5.json").write_text('{"model_type": "t5"}')
    (tmp_path / "bad.json").write_text("not json")
    assert main(["model", "stats", *(a.format(tmp=tmp_path) for a in argv)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("k2post model: error: ") and message in err[0], err


def test_cli_input_errors_come_before_torch_is_imported(tmp_path):
    missing = str(tmp_path / "x")
    code = (
        "import sys; from k2post.cli import main; "
        f"assert main(['model', 'stats', '--preset', 'gpt-9']) == main(['model', 'stats', {missing!r}]) == 2; "
        "assert 'torch' not in sys.modules"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("k2post model: error: ") == 2
