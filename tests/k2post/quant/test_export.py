"""`k2post model export --int4` (k2post/quant/export.py): the pack-quantized checkpoint unpacks bit-exactly to the
QAT forward's weights, transformers loads the unpacked model, and the CLI fails in one line on bad input."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from k2post.quant.export import dense_from_int4, export_int4
from k2post.quant.int4 import fake_quant_int4, quantize_int4
from k2post.quant.qat import QATConfig

ON = QATConfig(enabled=True)


@pytest.fixture(scope="module")
def exported(tiny_k2_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("int4") / "tiny-k2-int4"
    return export_int4(tiny_k2_dir, out, ON)


def test_export_writes_pack_quantized_experts_and_its_config(exported, tiny_k2_dir):
    from safetensors.torch import load_file

    assert exported.quantized == 3 * 8 * 3  # MoE layers x routed experts x (gate, up, down)
    assert exported.int4_bytes / exported.dense_bytes == pytest.approx((0.5 + 4 / 32) / 4, rel=0.01)  # fp32 model
    tensors = load_file(str(exported.out / "model.safetensors"))
    name = "model.layers.1.mlp.experts.5.down_proj"
    assert tensors[f"{name}.weight_packed"].dtype == torch.int32
    assert tensors[f"{name}.weight_shape"].tolist() == [512, 256]
    assert tensors[f"{name}.weight_scale"].shape == (512, 256 // 32)
    assert f"{name}.weight" not in tensors and "model.layers.1.self_attn.o_proj.weight" in tensors
    quant = json.loads((exported.out / "config.json").read_text())["quantization_config"]
    assert (quant["quant_method"], quant["format"]) == ("compressed-tensors", "pack-quantized")
    weights = quant["config_groups"]["group_0"]["weights"]
    assert (weights["num_bits"], weights["group_size"], weights["symmetric"], weights["strategy"]) == (
        4,
        32,
        True,
        "group",
    )
    assert "lm_head" in quant["ignore"] and "model.layers.1.mlp.shared_experts.down_proj" in quant["ignore"]
    assert not any(".experts." in name for name in quant["ignore"])
    assert (exported.out / "tokenizer.json").exists() or (exported.out / "tokenizer_config.json").exists()


def test_unpacked_export_is_the_fake_quant_weights_bit_for_bit(exported, tiny_k2_dir):
    from safetensors.torch import load_file

    original, dense = load_file(f"{tiny_k2_dir}/model.safetensors"), dense_from_int4(exported.out)
    assert set(dense) == set(original)
    for name, weight in original.items():
        want = fake_quant_int4(weight, 32) if ".mlp.experts." in name else weight
        assert torch.equal(dense[name], want), name


def test_compressed_tensors_unpacks_our_words(exported, tiny_k2_dir):
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
    from safetensors.torch import load_file

    tensors, original = (
        load_file(str(exported.out / "model.safetensors")),
        load_file(f"{tiny_k2_dir}/model.safetensors"),
    )
    name = "model.layers.2.mlp.experts.0.gate_proj"
    theirs = unpack_from_int32(tensors[f"{name}.weight_packed"], 4, torch.Size([256, 512]))
    assert torch.equal(theirs.to(torch.int8), quantize_int4(original[f"{name}.weight"], 32)[0])


def test_transformers_loads_the_unpacked_model(exported, tmp_path):
    from safetensors.torch import save_file

    from k2post.models.loading import load_causal_lm

    plain = tmp_path / "unpacked"
    shutil.copytree(exported.out, plain)
    config = json.loads((plain / "config.json").read_text())
    del config["quantization_config"]
    (plain / "config.json").write_text(json.dumps(config))
    save_file(dense_from_int4(exported.out), str(plain / "model.safetensors"), metadata={"format": "pt"})
    model = load_causal_lm(plain, "float32")
    fused = model.model.layers[3].mlp.experts.gate_up_proj.detach()
    assert torch.equal(fake_quant_int4(fused, 32), fused)  # already on the INT4 grid
    assert model(input_ids=torch.tensor([[5, 6, 7, 8, 9]])).logits.isfinite().all()


def test_cli_export_and_its_errors(tiny_k2_dir, tmp_path, capsys):
    from k2post_pipelines.model import main

    assert main(["export", str(tiny_k2_dir), "--int4", str(tmp_path / "a")]) == 0
    assert "72 linears quantized" in capsys.readouterr().out
    assert main(["export", str(tiny_k2_dir), "--int4", str(tmp_path / "a")]) == 2
    assert "exists and is not empty (pass --overwrite" in capsys.readouterr().err
    assert main(["export", str(tmp_path), "--int4", str(tmp_path / "b")]) == 2
    assert "not an HF model dir" in capsys.readouterr().err
    assert main(["export", str(tiny_k2_dir), "--int4", str(tmp_path / "c"), "--group-size", "48"]) == 2
    assert "qat.group_size 48" in capsys.readouterr().err


@pytest.mark.gpu
def test_vllm_serves_the_int4_export(exported):
    """GPU: vLLM loads the pack-quantized checkpoint with its compressed-tensors W4A16 MoE kernels and generates."""
    from k2post.rollout.config import SamplingConfig, VLLMEngineConfig
    from k2post.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine(exported.out, VLLMEngineConfig(dtype="bfloat16", max_model_len=256))
    try:
        out = engine.generate([[5, 6, 7, 8, 9, 10]], SamplingConfig(temperature=0.0, max_tokens=8))
    finally:
        engine.close()
    assert len(out[0][0].token_ids) == 8
