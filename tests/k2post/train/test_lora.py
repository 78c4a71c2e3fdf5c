"""LoRA for RL (k2post/train/lora.py): peft adapters on a frozen base, routed to AdamW, pushed merged.

The merged tensors are the base model's checkpoint tensors with W + (alpha / r) B A on every target (the model the
peft forward computes: a plain model loaded from `save_merged` gives the same logits); the adapter check names a
push that lost the adapter; the RL config refuses what LoRA cannot combine with.
Run: python -m pytest tests/k2post/train/test_lora.py -q
"""

from __future__ import annotations

import pytest
import torch

from k2post.train.lora_config import MLA_TARGETS, LoRAConfig

ON = LoRAConfig(enabled=True, rank=4, alpha=8.0)


def _perturb_adapters(model, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.05)


@pytest.fixture
def peft_qwen2(tiny_qwen2_dir):
    from k2post.models.loading import load_causal_lm
    from k2post.train.lora import apply_lora

    return apply_lora(load_causal_lm(tiny_qwen2_dir, "float32"), ON)


def test_only_the_adapters_train_and_they_go_to_adamw(peft_qwen2):
    from k2post.optim.config import OptimConfig
    from k2post.optim.param_groups import build_param_groups
    from k2post.train.lora import lora_optim, parameter_counts

    counts = parameter_counts(peft_qwen2)
    assert 0 < counts["trainable"] < counts["total"] / 10
    assert all(("lora_A" in n or "lora_B" in n) == p.requires_grad for n, p in peft_qwen2.named_parameters())
    groups = build_param_groups(peft_qwen2, lora_optim(OptimConfig()))
    assert [g["use_muon"] for g in groups] == [False]  # no Muon group: every adapter is AdamW's
    assert len(groups[0]["params"]) == 2 * 4 * 7  # A and B on 7 projections x 4 layers
    assert build_param_groups(peft_qwen2, OptimConfig())[0]["use_muon"]  # without lora_optim Muon takes the factors


def test_merged_tensors_are_base_plus_scaled_adapter(peft_qwen2, tiny_qwen2_dir):
    from k2post.models.loading import load_causal_lm
    from k2post.rollout.weight_update import checkpoint_named_tensors
    from k2post.train.lora import lora_layers, merged_named_tensors

    base = dict(checkpoint_named_tensors(load_causal_lm(tiny_qwen2_dir, "float32")))
    merged = dict(merged_named_tensors(peft_qwen2))
    assert merged.keys() == base.keys()
    assert all(torch.equal(merged[n], base[n]) for n in base)  # B = 0 at the start: the base model
    _perturb_adapters(peft_qwen2)
    merged = dict(merged_named_tensors(peft_qwen2))
    layer = lora_layers(peft_qwen2)["model.layers.1.self_attn.q_proj"]
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    want = base["model.layers.1.self_attn.q_proj.weight"] + (ON.alpha / ON.rank) * b @ a
    torch.testing.assert_close(merged["model.layers.1.self_attn.q_proj.weight"], want, rtol=0, atol=1e-6)
    assert torch.equal(merged["model.norm.weight"], base["model.norm.weight"])  # untouched tensors are the base's
    assert torch.equal(merged["model.embed_tokens.weight"], base["model.embed_tokens.weight"])


def test_saved_merged_model_computes_what_the_peft_model_does(peft_qwen2, tmp_path):
    from k2post.models.loading import load_causal_lm, load_tokenizer
    from k2post.train.lora import save_merged

    _perturb_adapters(peft_qwen2, seed=3)
    tokenizer = load_tokenizer(peft_qwen2.get_base_model().config._name_or_path)
    save_merged(peft_qwen2, tokenizer, tmp_path / "final", is_main=True)
    plain = load_causal_lm(tmp_path / "final", "float32")
    ids = torch.tensor([[2, 17, 3, 40, 41, 42, 99, 120]])
    with torch.no_grad():
        want, got = peft_qwen2(input_ids=ids).logits, plain(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert (tmp_path / "final" / "adapter" / "adapter_model.safetensors").is_file()
    assert not any("lora" in n for n, _ in plain.named_parameters())


def test_tiny_k2_takes_the_mla_projections(tiny_k2_dir):
    from k2post.models.loading import load_causal_lm
    from k2post.train.lora import apply_lora, lora_layers

    model = apply_lora(load_causal_lm(tiny_k2_dir, "float32"), LoRAConfig(enabled=True, target_modules=MLA_TARGETS))
    names = sorted(lora_layers(model))
    assert "model.layers.0.self_attn.kv_b_proj" in names and "model.layers.3.self_attn.q_a_proj" in names
    assert not any("experts" in n for n in names)  # fused experts are parameters, not linear modules


def test_a_target_that_matches_nothing_is_one_line(tiny_qwen2_dir):
    from k2post.models.loading import load_causal_lm
    from k2post.train.lora import LoRAError, apply_lora

    with pytest.raises(LoRAError, match=r"lora.target_modules \['wq'\] match no linear module .*q_proj") as err:
        apply_lora(load_causal_lm(tiny_qwen2_dir, "float32"), LoRAConfig(enabled=True, target_modules=["wq"]))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ({"w1": "m1", "w2": "m2"}, None),  # the merged weights arrived
        ({"w1": "b1", "w2": "m2"}, r"tensor 'w1': the engine holds the frozen base weight.*1 of 2"),
        ({"w1": "b1", "w2": "b2"}, r"tensor 'w1': .*2 of 2 adapted weights\): the adapter never arrived"),
    ],
)
def test_check_adapter_arrived(engine, message):
    from k2post.rollout.weight_update import PushVerificationError
    from k2post.train.lora import check_adapter_arrived

    base = {"w1": "b1", "w2": "b2"}
    if message is None:
        check_adapter_arrived(base, engine)
        return
    with pytest.raises(PushVerificationError, match=message):
        check_adapter_arrived(base, engine)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({}, r"lora.enabled with optim.qk_clip.enabled"),
        ({"optim": {"qk_clip": {"enabled": False}}, "qat": {"enabled": True}}, r"lora.enabled with qat.enabled"),
        ({"optim": {"qk_clip": {"enabled": False}}, "trainer": {"zero_stage": 3}}, r"trainer.zero_stage 3"),
        ({"optim": {"qk_clip": {"enabled": False}, "muon_patterns": ["lora_B"]}}, r"would send LoRA adapters to Muon"),
        ({"optim": {"qk_clip": {"enabled": False}}}, None),
    ],
)
def test_rl_config_refuses_what_lora_cannot_combine_with(extra, message):
    from k2post.config.loader import ConfigError, validate_config
    from k2post.rl.run_config import RLConfig

    raw = {"envs": [{"name": "math"}], "lora": {"enabled": True}, **extra}
    if message is None:
        assert validate_config(RLConfig, raw, "t").lora.enabled
        return
    with pytest.raises(ConfigError, match=message):
        validate_config(RLConfig, raw, "t")


def test_tied_embeddings_are_served_once_like_the_plain_push():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from k2post.rollout.weight_update import checkpoint_named_tensors
    from k2post.train.lora import apply_lora, merged_named_tensors

    cfg = Qwen2Config(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, intermediate_size=128, tie_word_embeddings=True)  # fmt: skip
    plain = [name for name, _ in checkpoint_named_tensors(Qwen2ForCausalLM(cfg))]
    merged = [name for name, _ in merged_named_tensors(apply_lora(Qwen2ForCausalLM(cfg), ON))]
    assert merged == plain and "lm_head.weight" not in merged  # vLLM refuses a tied alias without its target
