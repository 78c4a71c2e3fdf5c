"""Routing of parameters between Muon and AdamW (k2post/optim/param_groups.py).

Run: `python -m pytest tests/k2post/optim/test_param_groups.py -q`
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from k2post.models.flavors import flavor_config
from k2post.models.init import build_model
from k2post.optim.config import OptimConfig
from k2post.optim.param_groups import ParamSpecError, build_param_groups, describe_routing, route_param

VOCAB = 4096


@pytest.fixture(scope="module")
def tiny_models() -> dict[str, nn.Module]:
    """tiny-qwen2 and tiny-k2 built in memory (no tokenizer needed for routing)."""
    return {flavor: build_model(flavor_config(flavor, VOCAB), 0, VOCAB) for flavor in ("tiny-qwen2", "tiny-k2")}


def _routes(model: nn.Module, cfg: OptimConfig) -> dict[str, str]:
    return {name: route_param(name, param, cfg) for name, param in model.named_parameters()}


@pytest.mark.parametrize(
    ("flavor", "name", "expected"),
    [
        ("tiny-qwen2", "model.embed_tokens.weight", "adamw"),
        ("tiny-qwen2", "lm_head.weight", "adamw"),
        ("tiny-qwen2", "model.norm.weight", "adamw"),
        ("tiny-qwen2", "model.layers.0.input_layernorm.weight", "adamw"),
        ("tiny-qwen2", "model.layers.0.self_attn.q_proj.bias", "adamw"),
        ("tiny-qwen2", "model.layers.0.self_attn.q_proj.weight", "muon"),
        ("tiny-qwen2", "model.layers.0.self_attn.k_proj.weight", "muon"),
        ("tiny-qwen2", "model.layers.0.self_attn.v_proj.weight", "muon"),
        ("tiny-qwen2", "model.layers.0.self_attn.o_proj.weight", "muon"),
        ("tiny-qwen2", "model.layers.3.mlp.gate_proj.weight", "muon"),
        ("tiny-qwen2", "model.layers.3.mlp.down_proj.weight", "muon"),
        ("tiny-k2", "model.embed_tokens.weight", "adamw"),
        ("tiny-k2", "lm_head.weight", "adamw"),
        ("tiny-k2", "model.layers.0.self_attn.q_a_layernorm.weight", "adamw"),
        ("tiny-k2", "model.layers.0.self_attn.kv_a_layernorm.weight", "adamw"),
        ("tiny-k2", "model.layers.0.self_attn.q_a_proj.weight", "muon"),
        ("tiny-k2", "model.layers.0.self_attn.q_b_proj.weight", "muon"),
        ("tiny-k2", "model.layers.0.self_attn.kv_a_proj_with_mqa.weight", "muon"),
        ("tiny-k2", "model.layers.0.self_attn.kv_b_proj.weight", "muon"),
        ("tiny-k2", "model.layers.0.self_attn.o_proj.weight", "muon"),
        ("tiny-k2", "model.layers.0.mlp.up_proj.weight", "muon"),
        ("tiny-k2", "model.layers.1.mlp.gate.weight", "muon"),
        ("tiny-k2", "model.layers.1.mlp.experts.gate_up_proj", "muon"),
        ("tiny-k2", "model.layers.1.mlp.experts.down_proj", "muon"),
        ("tiny-k2", "model.layers.1.mlp.shared_experts.down_proj.weight", "muon"),
    ],
)
def test_route_of_known_params(tiny_models, flavor: str, name: str, expected: str) -> None:
    assert _routes(tiny_models[flavor], OptimConfig())[name] == expected


@pytest.mark.parametrize("flavor", ["tiny-qwen2", "tiny-k2"])
def test_every_param_routed_by_shape_rules(tiny_models, flavor: str) -> None:
    cfg = OptimConfig()
    for name, param in tiny_models[flavor].named_parameters():
        route = route_param(name, param, cfg)
        if param.ndim <= 1 or any(p in name for p in cfg.adamw_patterns):
            assert route == "adamw", name
        else:
            assert route == "muon", name


def test_router_bias_is_a_buffer_not_routed(tiny_models) -> None:
    model = tiny_models["tiny-k2"]
    assert any("e_score_correction_bias" in name for name, _ in model.named_buffers())
    assert not any("e_score_correction_bias" in name for name, _ in model.named_parameters())


@pytest.mark.parametrize("flavor", ["tiny-qwen2", "tiny-k2"])
def test_build_param_groups_covers_all_trainable_params_once(tiny_models, flavor: str) -> None:
    model = tiny_models[flavor]
    groups = build_param_groups(model, OptimConfig())
    assert [g["use_muon"] for g in groups] == [True, False]
    names = [n for g in groups for n in g["names"]]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())
    for group in groups:
        assert len(group["names"]) == len(group["params"])
        assert all(p.ndim in (2, 3) for p in group["params"]) or not group["use_muon"]


def test_frozen_params_are_skipped() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    model[0].weight.requires_grad_(False)
    groups = build_param_groups(model, OptimConfig())
    names = {n for g in groups for n in g["names"]}
    assert "0.weight" not in names and "1.weight" in names and "0.bias" in names
    assert "frozen" in describe_routing(model, OptimConfig())


def test_only_adamw_group_when_no_matrices() -> None:
    model = nn.LayerNorm(8)
    groups = build_param_groups(model, OptimConfig())
    assert len(groups) == 1 and groups[0]["use_muon"] is False


@pytest.mark.parametrize(
    ("shape", "patterns", "match"),
    [
        ((16,), ["norm"], r"'model.norm.weight'.*\(16,\).*muon_patterns"),
        ((), ["norm"], r"'model.norm.weight'.*0-D"),
    ],
)
def test_forcing_a_1d_param_to_muon_is_a_clear_error(shape, patterns, match) -> None:
    cfg = OptimConfig(muon_patterns=patterns)
    with pytest.raises(ParamSpecError, match=match):
        route_param("model.norm.weight", torch.zeros(shape), cfg)


def test_forced_1d_error_from_a_real_model(tiny_models) -> None:
    cfg = OptimConfig(muon_patterns=["input_layernorm"])
    with pytest.raises(ParamSpecError, match=r"input_layernorm.weight.*\(256,\).*more specific"):
        build_param_groups(tiny_models["tiny-qwen2"], cfg)


def test_muon_pattern_forces_a_matrix_otherwise_adamw() -> None:
    cfg = OptimConfig(adamw_patterns=["embed_tokens"], muon_patterns=["lm_head"])
    assert route_param("lm_head.weight", torch.zeros(8, 4), cfg) == "muon"


def test_pattern_matching_both_lists_is_an_error() -> None:
    cfg = OptimConfig(adamw_patterns=["head"], muon_patterns=["lm_"])
    with pytest.raises(ParamSpecError, match="both|adamw_patterns"):
        route_param("lm_head.weight", torch.zeros(8, 4), cfg)


def test_more_than_3d_is_an_error_unless_adamw_pattern() -> None:
    with pytest.raises(ParamSpecError, match=r"conv.weight.*4-D.*adamw_patterns"):
        route_param("conv.weight", torch.zeros(2, 3, 4, 5), OptimConfig())
    assert route_param("conv.weight", torch.zeros(2, 3, 4, 5), OptimConfig(adamw_patterns=["conv"])) == "adamw"


def test_adamw_pattern_takes_matrices() -> None:
    assert route_param("model.embed_tokens.weight", torch.zeros(10, 4), OptimConfig()) == "adamw"
    assert route_param("model.embed_tokens.weight", torch.zeros(10, 4), OptimConfig(adamw_patterns=[])) == "muon"


def test_describe_routing_lists_every_param_and_totals(tiny_models) -> None:
    model = tiny_models["tiny-k2"]
    table = describe_routing(model, OptimConfig())
    for name, _ in model.named_parameters():
        assert name in table
    assert "8x512x512" in table and "total muon:" in table and "total adamw:" in table
    n_total = sum(p.numel() for p in model.parameters())
    totals = [int(line.rsplit(" ", 2)[1].replace(",", "")) for line in table.splitlines() if line.startswith("total")]
    assert sum(totals) == n_total
