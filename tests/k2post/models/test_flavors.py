"""Tiny model flavors: registry, shapes, save/reload, a training step, MLA weight layout."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.models.deepseek_v3 import modeling_deepseek_v3

from k2post.models.flavors import (
    FLAVORS,
    VLLM_CPU_HEAD_SIZES,
    flavor_config,
    QWEN2_VOCAB_ROWS,
    known_flavors,
    register_flavor,
    tiny_qwen2_config,
)
from k2post.models.init import count_params


def _batch(vocab_size: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(20, vocab_size - 64, (2, 16), generator=generator)


def test_registry_has_builtin_flavors() -> None:
    assert {"tiny-qwen2", "tiny-k2", "qwen2-0.5b"} <= set(known_flavors())
    assert flavor_config("tiny-qwen2", 4160).model_type == "qwen2"
    assert flavor_config("qwen2-0.5b", 4160).model_type == "qwen2"
    assert flavor_config("tiny-k2", 4160).model_type == "deepseek_v3"


def test_duplicate_registration_is_an_error() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_flavor("tiny-qwen2", "again", tiny_qwen2_config)
    assert FLAVORS["tiny-qwen2"].build is tiny_qwen2_config


def test_unknown_flavor_lists_known_ones() -> None:
    with pytest.raises(KeyError, match="tiny-k2.*tiny-qwen2"):
        flavor_config("tiny-llama", 4160)


def test_tiny_qwen2_dims() -> None:
    config = flavor_config("tiny-qwen2", 4160)
    head_dim = config.hidden_size // config.num_attention_heads
    assert head_dim == 64 and head_dim in VLLM_CPU_HEAD_SIZES
    assert (config.hidden_size, config.num_hidden_layers, config.intermediate_size) == (256, 4, 512)
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 2)
    assert config.rope_parameters["rope_theta"] == 10000.0
    assert config.tie_word_embeddings is False and config.vocab_size == 4160


def test_qwen2_05b_is_qwen2_05b_shaped_on_the_meta_device() -> None:
    config = flavor_config("qwen2-0.5b", 4096)
    head_dim = config.hidden_size // config.num_attention_heads
    assert head_dim == 64 and head_dim in VLLM_CPU_HEAD_SIZES
    assert (config.hidden_size, config.num_hidden_layers, config.intermediate_size) == (896, 24, 4864)
    assert (config.num_attention_heads, config.num_key_value_heads) == (14, 2)
    assert config.rope_parameters["rope_theta"] == 1e6 and config.rms_norm_eps == 1e-6
    assert config.tie_word_embeddings is True and config.vocab_size == QWEN2_VOCAB_ROWS == 151_936
    assert flavor_config("qwen2-0.5b", 200_000).vocab_size == 200_000  # a larger tokenizer keeps its own rows
    with torch.device("meta"):  # no 2 GB of weights: shapes only
        model = AutoModelForCausalLM.from_config(config)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert count_params(model) == 494_032_768  # Qwen2-0.5B's published count


def test_tiny_qwen2_reload_gives_identical_logits(tiny_qwen2_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2_dir).eval()
    again = AutoModelForCausalLM.from_pretrained(tiny_qwen2_dir).eval()
    tokens = _batch(model.config.vocab_size)
    with torch.no_grad():
        assert torch.equal(model(tokens).logits, again(tokens).logits)
    assert model.config.vocab_size % 64 == 0
    assert model.dtype == torch.float32


def test_tiny_k2_structure(tiny_k2_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_k2_dir)
    config = model.config
    assert type(model).__name__ == "DeepseekV3ForCausalLM"
    assert (config.q_lora_rank, config.kv_lora_rank) == (256, 512)
    assert (config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim) == (64, 64, 64)
    assert config.n_shared_experts == 1 and config.first_k_dense_replace == 1
    assert (config.topk_method, config.scoring_func) == ("noaux_tc", "sigmoid")
    assert (config.n_routed_experts, config.num_experts_per_tok, config.n_group) == (8, 2, 1)
    layers = model.model.layers
    assert type(layers[0].mlp).__name__ == "DeepseekV3MLP"
    assert all(type(layer.mlp).__name__ == "DeepseekV3MoE" for layer in layers[1:])
    assert 10_000_000 <= count_params(model) <= 50_000_000


def test_tiny_k2_router_bias_is_a_saved_buffer(tiny_k2_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_k2_dir)
    name = "model.layers.1.mlp.gate.e_score_correction_bias"
    assert name in model.state_dict() and name not in dict(model.named_parameters())
    assert model.get_parameter("model.layers.1.mlp.gate.weight").shape == (8, 512)


def test_tiny_k2_adamw_step_updates_weights(tiny_k2_dir: Path) -> None:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_k2_dir).train()
    before = {name: param.detach().clone() for name, param in model.named_parameters()}
    tokens = _batch(model.config.vocab_size)
    loss = model(tokens, labels=tokens).loss
    assert torch.isfinite(loss)
    loss.backward()
    experts = {n: p for n, p in model.named_parameters() if p.ndim == 3}
    assert len(experts) == 2 * (model.config.num_hidden_layers - 1)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in experts.values())
    assert model.get_parameter("model.layers.1.mlp.gate.weight").grad.abs().sum() > 0
    torch.optim.AdamW(model.parameters(), lr=1e-3).step()
    changed = [name for name, param in model.named_parameters() if not torch.equal(param, before[name])]
    assert "model.layers.1.mlp.experts.gate_up_proj" in changed
    assert "model.layers.0.self_attn.kv_b_proj.weight" in changed
    assert torch.isfinite(model(tokens, labels=tokens).loss)


def _record_logits(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """Make eager attention record each layer's pre-softmax logits [B, H, T, T]."""
    records: list[torch.Tensor] = []
    original = modeling_deepseek_v3.eager_attention_forward

    def recording(module, query, key, value, attention_mask, scaling, **kwargs):
        records.append((query @ key.transpose(2, 3) * scaling).detach())
        return original(module, query, key, value, attention_mask, scaling, **kwargs)

    monkeypatch.setattr(modeling_deepseek_v3, "eager_attention_forward", recording)
    return records


@torch.no_grad()
def _clip_head(attn: torch.nn.Module, head: int, gamma: float) -> None:
    """QK-Clip one MLA head with the row layout documented in the report."""
    nope, rope, v_dim = attn.qk_nope_head_dim, attn.qk_rope_head_dim, attn.v_head_dim
    q_rows = attn.q_b_proj.weight[head * (nope + rope) : (head + 1) * (nope + rope)]
    q_rows[:nope] *= gamma**0.5
    q_rows[nope:] *= gamma
    kv_rows = attn.kv_b_proj.weight[head * (nope + v_dim) : (head + 1) * (nope + v_dim)]
    kv_rows[:nope] *= gamma**0.5


def test_tiny_k2_mla_row_layout_for_qk_clip(tiny_k2_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_k2_dir, attn_implementation="eager").eval()
    records = _record_logits(monkeypatch)
    tokens = _batch(model.config.vocab_size)
    with torch.no_grad():
        model(tokens)
        base = records[0].clone()
        records.clear()
        _clip_head(model.model.layers[0].self_attn, head=2, gamma=0.25)
        model(tokens)
    clipped = records[0]
    torch.testing.assert_close(clipped[:, 2], base[:, 2] * 0.25, rtol=1e-4, atol=1e-6)
    others = [0, 1, 3]
    torch.testing.assert_close(clipped[:, others], base[:, others], rtol=0, atol=0)
