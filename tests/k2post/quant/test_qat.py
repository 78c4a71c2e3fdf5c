"""INT4 QAT in the forward (k2post/quant/qat.py) on tiny-k2's fused MoE experts."""

from __future__ import annotations

import pytest
import torch

from k2post.quant.int4 import fake_quant_int4
from k2post.quant.qat import QATConfig, QATError, install_qat, qat_targets, quantized_weights

ON = QATConfig(enabled=True)


@pytest.fixture
def k2_model(tiny_k2_dir):
    from k2post.models.loading import load_causal_lm

    return load_causal_lm(tiny_k2_dir, "float32")


def test_default_targets_are_the_routed_experts_only(k2_model):
    targets = qat_targets(k2_model, ON)
    assert targets == {f"model.layers.{i}.mlp.experts": ["gate_up_proj", "down_proj"] for i in (1, 2, 3)}


def test_forward_uses_int4_weights_and_gradients_reach_the_full_precision_ones(k2_model):
    ids = torch.tensor([[5, 17, 40, 99, 3, 8, 12, 77]])
    reference = {n: p.detach().clone() for n, p in k2_model.named_parameters()}
    install_qat(k2_model, ON)
    install_qat(k2_model, ON)  # idempotent: one wrapper
    out = k2_model(input_ids=ids).logits
    # the same model with its expert weights replaced by their INT4 round trip, no QAT: the same logits
    from k2post.models.loading import load_causal_lm

    plain = load_causal_lm(k2_model.name_or_path, "float32")
    with torch.no_grad():
        for name, weight in quantized_weights(k2_model, ON).items():
            plain.get_parameter(name).copy_(weight)
    torch.testing.assert_close(out, plain(input_ids=ids).logits, rtol=0, atol=0)
    out.logsumexp(-1).sum().backward()
    experts = k2_model.model.layers[1].mlp.experts
    assert isinstance(experts.gate_up_proj, torch.nn.Parameter) and experts.gate_up_proj.grad is not None
    for name, param in k2_model.named_parameters():  # the stored weights are untouched full precision
        assert torch.equal(param.detach(), reference[name]), name
    assert not torch.equal(fake_quant_int4(experts.gate_up_proj.detach(), 32), experts.gate_up_proj.detach())


def test_checkpoint_tensors_carry_the_quantized_experts(k2_model):
    from k2post.rollout.weight_update import checkpoint_named_tensors

    served = dict(checkpoint_named_tensors(k2_model, replace=quantized_weights(k2_model, ON)))
    fused = k2_model.model.layers[2].mlp.experts.gate_up_proj.detach()
    half = fused.shape[1] // 2
    assert torch.equal(served["model.layers.2.mlp.experts.3.up_proj.weight"], fake_quant_int4(fused, 32)[3, half:])
    attention = "model.layers.2.self_attn.o_proj.weight"
    assert torch.equal(served[attention], k2_model.get_parameter(attention).detach())  # not a target


def test_qat_config_errors_name_the_fix(k2_model):
    with pytest.raises(QATError, match=r"match no module with weights"):
        qat_targets(k2_model, QATConfig(enabled=True, modules=["*.nothing"]))
    with pytest.raises(QATError, match=r"not a multiple of qat.group_size 48"):
        qat_targets(k2_model, QATConfig(enabled=True, group_size=48))
    assert install_qat(k2_model, QATConfig()) == {}  # off: nothing wrapped
