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


def _saved_outside_params(model, ids) -> int:
    """Bytes of the storages the autograd graph keeps for backward, outside the parameters, measured when the
    forward returns (where ZeRO-3 has released its gathered parameters: what is left is this)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            kept.setdefault(storage.data_ptr(), storage)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(input_ids=ids).logits.logsumexp(-1).sum()
    held = sum(storage.nbytes() for storage in kept.values())
    loss.backward()
    return held


def test_qat_keeps_no_quantized_weight_for_backward(tiny_k2_dir):
    """The INT4 weights are recomputed in the backward, not held from the forward to it (ZeRO-3 frees only the
    parameters): the bytes kept for backward are those of the model without QAT (before: 12.5 -> 48.5 MiB)."""
    from k2post.models.loading import load_causal_lm

    ids = torch.arange(64).reshape(2, 32) * 37 % 4000
    plain, quantized = (load_causal_lm(tiny_k2_dir, "float32") for _ in range(2))
    install_qat(quantized, ON)
    without, with_qat = _saved_outside_params(plain, ids), _saved_outside_params(quantized, ids)
    print(f"kept for backward: {without / 2**20:.1f} MiB without QAT, {with_qat / 2**20:.1f} MiB with")
    assert 0 < with_qat <= 1.1 * without, (with_qat / 2**20, without / 2**20)


class _Experts(torch.nn.Module):
    """Fused experts as transformers lays them out: [experts, out, in], each expert a slice fed to F.linear."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = self.weight if self.weight.dim() == 3 else self.weight[None]
        return sum(torch.nn.functional.linear(x, w).tanh() for w in weights)


def _previous_ste(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """The implementation before the recompute: a fresh tensor (w + (w_hat - w).detach()) kept for backward."""
    return weight + (fake_quant_int4(weight, group_size) - weight).detach()


@pytest.mark.parametrize(
    ("shape", "dtype", "group_size"),
    [
        ((16, 64), torch.float32, 32),
        ((4, 24, 64), torch.float32, 32),
        ((3, 8, 96), torch.float32, 32),
        ((4, 24, 64), torch.bfloat16, 32),
        ((2, 16, 128), torch.float32, 128),
        ((5, 12, 32), torch.bfloat16, 16),
    ],
)
def test_recomputed_int4_gives_the_previous_values_and_gradients_bit_for_bit(shape, dtype, group_size):
    x = torch.randn(2, 7, shape[-1], generator=torch.Generator().manual_seed(1)).to(dtype)
    module = torch.nn.Sequential()
    module.add_module("experts", _Experts(shape, dtype))
    reference = _Experts(shape, dtype)
    install_qat(module, QATConfig(enabled=True, modules=["experts"], group_size=group_size))
    x_new, x_old = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = module(x_new)
    weights = _previous_ste(reference.weight, group_size)
    expected = sum(torch.nn.functional.linear(x_old, w).tanh() for w in (weights if len(shape) == 3 else weights[None]))
    assert torch.equal(out, expected)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(dtype)
    out.backward(grad, retain_graph=True)
    expected.backward(grad)
    assert torch.equal(module.experts.weight.grad, reference.weight.grad) and torch.equal(x_new.grad, x_old.grad)
    out.backward(grad)  # a retained graph recomputes the released weights again: the same gradients once more
    assert torch.equal(module.experts.weight.grad, 2 * reference.weight.grad)
    assert torch.equal(x_new.grad, 2 * x_old.grad)
