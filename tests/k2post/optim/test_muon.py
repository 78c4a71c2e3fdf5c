"""Muon / MuonClip numerics (k2post/optim/newton_schulz.py, k2post/optim/muon.py).

Compared against torch.optim.Muon and torch.optim.AdamW; CPU only, a few seconds.
Run: `python -m pytest tests/k2post/optim/test_muon.py -q`
"""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch
from torch import Tensor, nn

from k2post.optim import muon as muon_module
from k2post.optim.config import OptimConfig
from k2post.optim.muon import (
    MuonClip,
    adamw_step_,
    build_optimizer,
    group_hparams,
    muon_direction,
    muon_step_,
    muon_update,
    orthogonalize_many,
)
from k2post.optim.newton_schulz import NS_COEFFS, ns_compute_dtype, orthogonalize
from k2post.optim.param_groups import ParamSpecError, row_splits

BF16_TOL = {"rtol": 2e-2, "atol": 2e-2}


def _params(shapes: list[tuple[int, ...]], seed: int = 0) -> list[nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [nn.Parameter(torch.randn(shape, generator=gen) * 0.02) for shape in shapes]


def _clone(params: list[nn.Parameter]) -> list[nn.Parameter]:
    return [nn.Parameter(p.detach().clone()) for p in params]


def _set_grads(groups: list[list[nn.Parameter]], step: int) -> None:
    """Same random grads (seeded by step) on every param list in `groups`."""
    gen = torch.Generator().manual_seed(1000 + step)
    grads = [torch.randn(p.shape, generator=gen) for p in groups[0]]
    for params in groups:
        for p, g in zip(params, grads):
            p.grad = g.clone()


def _rms(t: torch.Tensor) -> float:
    return t.pow(2).mean().sqrt().item()


# --- Newton-Schulz ------------------------------------------------------------------------


def test_ns_coefficients() -> None:
    assert NS_COEFFS == (3.4445, -4.7750, 2.0315)


@pytest.mark.parametrize("shape", [(64, 64), (48, 96), (96, 48)])
def test_ns_keeps_singular_vectors(shape: tuple[int, int]) -> None:
    """U^T NS(M) V is near-diagonal with diagonal in [0.6, 1.25] (5 bf16 steps overshoot 1)."""
    n, m = shape
    k = min(n, m)
    gen = torch.Generator().manual_seed(0)
    U = torch.linalg.qr(torch.randn(n, k, generator=gen))[0]  # [n, k]
    V = torch.linalg.qr(torch.randn(m, k, generator=gen))[0]  # [m, k]
    S = torch.linspace(1.0, 0.1, k)  # condition number 10
    M = U @ torch.diag(S) @ V.T  # [n, m]
    D = U.T @ orthogonalize(M) @ V  # [k, k]
    diag = torch.diagonal(D)
    assert diag.min() > 0.6 and diag.max() < 1.25, (diag.min(), diag.max())
    off = D - torch.diag(diag)
    assert off.abs().max() < 0.05
    # singular vectors align: NS(M) v_i points along u_i
    cols = orthogonalize(M) @ V  # [n, k]
    cosine = (cols * U).sum(0) / cols.norm(dim=0)
    assert cosine.min() > 0.995


def test_ns_of_exact_orthogonal_matrix_stays_near_it() -> None:
    Q = torch.linalg.qr(torch.randn(64, 32, generator=torch.Generator().manual_seed(1)))[0]  # [64, 32]
    sv = torch.linalg.svdvals(orthogonalize(Q))
    assert sv.min() > 0.6 and sv.max() < 1.25


@pytest.mark.parametrize("shape", [(4, 32, 64), (4, 64, 32), (3, 16, 16)])
def test_3d_is_orthogonalized_per_expert(shape: tuple[int, int, int]) -> None:
    gen = torch.Generator().manual_seed(0)
    scales = torch.logspace(-3, 3, shape[0]).view(-1, 1, 1)  # experts of very different scale
    M = torch.randn(shape, generator=gen) * scales
    batched = orthogonalize(M)
    for e in range(shape[0]):
        torch.testing.assert_close(batched[e], orthogonalize(M[e]), **BF16_TOL)
        assert 0.5 < _rms(batched[e]) * math.sqrt(max(shape[1:])) < 1.2  # each normalized on its own


def test_orthogonalize_keeps_dtype_and_input() -> None:
    M = torch.randn(8, 16)
    before = M.clone()
    out = orthogonalize(M)
    assert out.dtype == torch.float32 and out.shape == M.shape
    assert torch.equal(M, before)
    assert orthogonalize(M.bfloat16()).dtype == torch.bfloat16
    assert orthogonalize(torch.zeros(4, 6)).abs().max() == 0  # eps: no NaN on a zero gradient
    with pytest.raises(ValueError, match="matrix"):
        orthogonalize(torch.randn(5))


@pytest.mark.parametrize("shape", [(64, 64), (128, 512), (512, 128), (256, 1024)])
def test_update_rms_close_to_0_2(shape: tuple[int, int]) -> None:
    """RMS(O) = 0.2 * sqrt(mean s'^2); measured 0.173-0.191 here: 5 bf16 steps leave s' in ~[0.68, 1.2]."""
    M = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    ortho = muon_update(M, ns_steps=5, eps=1e-7, rms_scale=0.2)
    assert 0.165 < _rms(ortho) < 0.215
    s = torch.linalg.svdvals(orthogonalize(M))
    assert _rms(ortho) == pytest.approx(0.2 * s.pow(2).mean().sqrt().item(), rel=1e-3)


@pytest.mark.parametrize("shape", [(64, 64), (128, 512), (512, 128)])
def test_rms_scale_is_exact_for_exact_orthogonalization(shape: tuple[int, int]) -> None:
    """The lemma behind rms_scale: RMS(U V^T) * 0.2 * sqrt(max(n, m)) = 0.2."""
    U, _, Vh = torch.linalg.svd(torch.randn(shape, dtype=torch.float64), full_matrices=False)
    assert _rms(U @ Vh) * 0.2 * math.sqrt(max(shape)) == pytest.approx(0.2, rel=1e-9)


# --- Muon vs torch.optim.Muon --------------------------------------------------------------

SHAPE_SETS = {
    "square": [(64, 64)],
    "wide": [(32, 128)],
    "tall": [(128, 32)],
    "mixed+batched": [(64, 128), (128, 64), (96, 96), (128, 64), (64, 128), (17, 40)],
}


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
@pytest.mark.parametrize("shapes", list(SHAPE_SETS.values()), ids=list(SHAPE_SETS))
def test_muon_matches_torch_muon(shapes: list[tuple[int, int]], weight_decay: float) -> None:
    """torch decays W <- W(1 - lr*wd) with the unadjusted lr, like K2, so one test covers both."""
    ours = _params(shapes)
    theirs = _clone(ours)
    cfg = OptimConfig(lr=0.02, weight_decay=weight_decay, ns_dtype="bfloat16")
    opt = MuonClip([{"params": ours, "use_muon": True}], cfg)
    ref = torch.optim.Muon(
        theirs,
        lr=0.02,
        weight_decay=weight_decay,
        momentum=0.95,
        nesterov=True,
        ns_steps=5,
        adjust_lr_fn="match_rms_adamw",
    )
    for step in range(4):
        _set_grads([ours, theirs], step)
        opt.step()
        ref.step()
    for p, q in zip(ours, theirs):
        torch.testing.assert_close(p, q)
        torch.testing.assert_close(opt.state[p]["momentum_buffer"], ref.state[q]["momentum_buffer"])


def test_muon_without_nesterov_matches_torch() -> None:
    ours = _params([(48, 80)])
    theirs = _clone(ours)
    opt = MuonClip(
        [{"params": ours, "use_muon": True}], OptimConfig(lr=0.01, nesterov=False, momentum=0.9, ns_dtype="bfloat16")
    )
    ref = torch.optim.Muon(
        theirs, lr=0.01, weight_decay=0.1, momentum=0.9, nesterov=False, adjust_lr_fn="match_rms_adamw"
    )
    for step in range(3):
        _set_grads([ours, theirs], step)
        opt.step()
        ref.step()
    torch.testing.assert_close(ours[0], theirs[0])


@pytest.mark.parametrize(
    "setting,device,expected",
    [
        ("auto", "cpu", torch.float32),
        ("auto", "cuda", torch.bfloat16),
        ("bfloat16", "cpu", torch.bfloat16),
        ("float32", "cuda", torch.float32),
    ],
)
def test_ns_compute_dtype(setting: str, device: str, expected: torch.dtype) -> None:
    assert ns_compute_dtype(setting, torch.device(device)) == expected


def test_fp32_ns_step_is_torch_muon_within_bf16_rounding() -> None:
    """The CPU default (`ns_dtype: auto` = fp32 NS) gives torch.optim.Muon's (bf16) step up to bf16 rounding."""
    ours = _params(SHAPE_SETS["mixed+batched"])
    theirs = _clone(ours)
    opt = MuonClip([{"params": ours, "use_muon": True}], OptimConfig(lr=0.02, weight_decay=0.1))
    ref = torch.optim.Muon(
        theirs, lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True, adjust_lr_fn="match_rms_adamw"
    )
    before = _clone(ours)
    _set_grads([ours, theirs], 0)
    opt.step()
    ref.step()
    for p, q, p0 in zip(ours, theirs, before):
        step_ours, step_ref = p.detach() - p0.detach(), q.detach() - p0.detach()
        assert not torch.equal(step_ours, step_ref)  # fp32 really ran
        torch.testing.assert_close(step_ours, step_ref, atol=0.02 * step_ref.abs().max().item(), rtol=0.05)


def test_weight_decay_formula() -> None:
    """Zero gradient: O = 0, so one step is exactly W <- W * (1 - lr * wd)."""
    (p,) = _params([(16, 32)])
    w0 = p.detach().clone()
    p.grad = torch.zeros_like(p)
    MuonClip([{"params": [p], "use_muon": True}], OptimConfig(lr=0.5, weight_decay=0.1)).step()
    torch.testing.assert_close(p.detach(), w0 * (1 - 0.5 * 0.1), rtol=0, atol=0)


def test_momentum_convention_equals_k2_form_up_to_scale() -> None:
    """torch's lerp form is (1 - mu) times K2's buf <- mu*buf + g, D = g + mu*buf; NS ignores the scale."""
    mu = 0.95
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(32, 64, generator=gen) for _ in range(4)]
    buf, k2_buf = torch.zeros(32, 64), torch.zeros(32, 64)
    for g in grads:
        direction = muon_direction(g, buf, mu, nesterov=True)
        k2_buf = mu * k2_buf + g
        k2_direction = g + mu * k2_buf
        torch.testing.assert_close(buf, (1 - mu) * k2_buf)
        torch.testing.assert_close(direction, (1 - mu) * k2_direction)
        torch.testing.assert_close(orthogonalize(direction), orthogonalize(k2_direction), **BF16_TOL)
    assert muon_direction(grads[0], buf, mu, nesterov=False) is buf


def test_muon_update_scale_uses_last_two_dims() -> None:
    D = torch.randn(4, 16, 64)
    torch.testing.assert_close(muon_update(D, 5, 1e-7, 0.2), orthogonalize(D) * 0.2 * 8.0)


@pytest.mark.parametrize("shape", [(3, 32, 16), (3, 16, 32), (24, 40)])
def test_muon_step_free_function_equals_optimizer(shape: tuple[int, ...]) -> None:
    """The per-tensor API a distributed caller uses gives what MuonClip.step gives."""
    a, b = _params([shape, shape])
    b.data.copy_(a.data)
    cfg = OptimConfig(lr=0.01)
    opt = MuonClip([{"params": [a], "use_muon": True}], cfg)
    state: dict = {}
    for step in range(3):
        _set_grads([[a], [b]], step)
        opt.step()
        muon_step_(b, b.grad, state, group_hparams(cfg))
    torch.testing.assert_close(a, b)


def test_3d_expert_param_step_equals_per_expert_2d_steps() -> None:
    (w3,) = _params([(4, 24, 40)])
    slices = [nn.Parameter(w3.detach()[e].clone()) for e in range(4)]
    cfg = OptimConfig(lr=0.01)
    opt3 = MuonClip([{"params": [w3], "use_muon": True}], cfg)
    opt2 = MuonClip([{"params": slices, "use_muon": True}], cfg)
    for step in range(3):
        _set_grads([[w3]], step)
        for e, s in enumerate(slices):
            s.grad = w3.grad[e].clone()
        opt3.step()
        opt2.step()
    torch.testing.assert_close(w3.detach(), torch.stack([s.detach() for s in slices]))


def test_muon_group_rejects_vectors() -> None:
    with pytest.raises(ParamSpecError, match=r"norm.*\(8,\)"):
        MuonClip([{"params": [nn.Parameter(torch.ones(8))], "names": ["norm"], "use_muon": True}], OptimConfig())
    with pytest.raises(ValueError, match="use_muon"):
        MuonClip([{"params": [nn.Parameter(torch.ones(8, 8))]}], OptimConfig())


@pytest.mark.parametrize("shapes", [[(24, 40), (3, 24, 40), (24, 40)], [(40, 24), (2, 40, 24)]], ids=["wide", "tall"])
def test_orthogonalize_many_equals_one_by_one(shapes: list[tuple[int, ...]]) -> None:
    gen = torch.Generator().manual_seed(0)
    directions = [torch.randn(shape, generator=gen) for shape in shapes]
    for d, ortho in zip(directions, orthogonalize_many(directions, 5, 1e-7)):
        assert ortho.shape == d.shape and ortho.dtype == torch.bfloat16
        torch.testing.assert_close(ortho.float(), orthogonalize(d), **BF16_TOL)
    with pytest.raises(ValueError, match="sharing one"):
        orthogonalize_many([torch.randn(4, 8), torch.randn(8, 4)])


def test_batch_size_limit_does_not_change_results(monkeypatch) -> None:
    shapes = [(32, 48), (2, 32, 48), (32, 48), (48, 32)]
    a = _params(shapes)
    b = _clone(a)
    opt_a = MuonClip([{"params": a, "use_muon": True}], OptimConfig(lr=0.01))
    opt_b = MuonClip([{"params": b, "use_muon": True}], OptimConfig(lr=0.01))
    _set_grads([a, b], 0)
    opt_a.step()
    monkeypatch.setattr(muon_module, "MAX_BATCH_NUMEL", 32 * 48)  # one matrix per batch
    opt_b.step()
    for p, q in zip(a, b):
        torch.testing.assert_close(p, q)


# --- AdamW groups --------------------------------------------------------------------------


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
@pytest.mark.parametrize("shapes", [[(7,)], [(16, 32)], [(3, 4, 5), (9,), ()]], ids=["1d", "2d", "mixed"])
def test_adamw_group_matches_torch_adamw(shapes: list[tuple[int, ...]], weight_decay: float) -> None:
    ours = _params(shapes)
    theirs = _clone(ours)
    cfg = OptimConfig(lr=1e-2, weight_decay=weight_decay)
    opt = MuonClip([{"params": ours, "use_muon": False}], cfg)
    ref = torch.optim.AdamW(theirs, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=weight_decay, foreach=False)
    for step in range(5):
        _set_grads([ours, theirs], step)
        opt.step()
        ref.step()
    for p, q in zip(ours, theirs):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
        torch.testing.assert_close(opt.state[p]["exp_avg_sq"], ref.state[q]["exp_avg_sq"])
        assert opt.state[p]["step"] == int(ref.state[q]["step"])


def test_group_overrides_lr_and_weight_decay() -> None:
    a, b = _params([(6,), (6,)])
    b.data.copy_(a.data)
    opt = MuonClip([{"params": [a], "use_muon": False, "lr": 0.1, "weight_decay": 0.0}], OptimConfig(lr=1e-3))
    ref = torch.optim.AdamW([b], lr=0.1, betas=(0.9, 0.95), weight_decay=0.0, foreach=False)
    _set_grads([[a], [b]], 0)
    opt.step()
    ref.step()
    torch.testing.assert_close(a, b)
    assert opt.param_groups[0]["lr"] == 0.1 and opt.param_groups[0]["momentum"] == 0.95


def test_adamw_step_free_function_on_a_shard() -> None:
    """Elementwise: updating two halves separately equals updating the whole tensor."""
    (p,) = _params([(10,)])
    halves = [p.detach()[:5].clone(), p.detach()[5:].clone()]
    group = group_hparams(OptimConfig(lr=1e-2))
    whole_state: dict = {}
    half_states: list[dict] = [{}, {}]
    for step in range(3):
        g = torch.randn(10, generator=torch.Generator().manual_seed(step))
        adamw_step_(p.data, g, whole_state, group)
        for half, st, gh in zip(halves, half_states, g.split(5)):
            adamw_step_(half, gh, st, group)
    torch.testing.assert_close(p.detach(), torch.cat(halves), rtol=0, atol=0)


# --- Optimizer mechanics -------------------------------------------------------------------


class _Toy(nn.Module):
    """Matrices, a 3-D expert stack, a norm and an embedding: both kinds of groups."""

    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(32, 16)
        self.proj = nn.Linear(16, 24)
        self.experts = nn.Parameter(torch.randn(3, 24, 16) * 0.1)
        self.norm = nn.LayerNorm(16)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.proj(self.embed_tokens(ids)))  # [B, 24]
        h = torch.einsum("bi,eio->bo", h, self.experts)  # [B, 16]
        return self.norm(h).pow(2).mean()


def _train(model: _Toy, opt: MuonClip, steps: range) -> None:
    for step in steps:
        opt.zero_grad()
        ids = torch.randint(0, 32, (8,), generator=torch.Generator().manual_seed(step))
        model(ids).backward()
        opt.step()


def test_state_dict_round_trip_is_bitwise() -> None:
    torch.manual_seed(0)
    cfg = OptimConfig(lr=1e-2)
    full = _Toy()
    half = copy.deepcopy(full)
    opt_full = build_optimizer(full, cfg)
    _train(full, opt_full, range(5))
    opt_half = build_optimizer(half, cfg)
    _train(half, opt_half, range(3))
    buffer = io.BytesIO()
    torch.save({"model": half.state_dict(), "optim": opt_half.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer)
    resumed = _Toy()
    resumed.load_state_dict(saved["model"])
    opt_resumed = build_optimizer(resumed, cfg)
    opt_resumed.load_state_dict(saved["optim"])
    _train(resumed, opt_resumed, range(3, 5))
    for (name, a), b in zip(full.named_parameters(), resumed.parameters()):
        assert torch.equal(a, b), name
    assert opt_resumed.param_groups[0]["names"] == opt_full.param_groups[0]["names"]


def test_none_grads_are_skipped_and_state_kept() -> None:
    torch.manual_seed(0)
    model = _Toy()
    opt = build_optimizer(model, OptimConfig(lr=1e-2))
    _train(model, opt, range(1))
    frozen = [model.proj.weight, model.norm.weight]
    before = {
        id(p): (p.detach().clone(), {k: v.clone() if torch.is_tensor(v) else v for k, v in opt.state[p].items()})
        for p in frozen
    }
    ids = torch.randint(0, 32, (8,))
    opt.zero_grad()
    model(ids).backward()
    for p in frozen:
        p.grad = None
    opt.step()
    for p in frozen:
        weight, state = before[id(p)]
        assert torch.equal(p, weight)
        assert state.keys() == opt.state[p].keys()
        for key, value in state.items():
            assert torch.equal(opt.state[p][key], value) if torch.is_tensor(value) else opt.state[p][key] == value
    assert opt.state[model.embed_tokens.weight]["step"] == 2


# --- A real model ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_k2() -> nn.Module:
    from k2post.models.flavors import flavor_config
    from k2post.models.init import build_model

    return build_model(flavor_config("tiny-k2", 4096), 0, 4096).train()


def test_full_step_on_tiny_k2_changes_params_and_lowers_loss(tiny_k2) -> None:
    model = tiny_k2
    opt = build_optimizer(model, OptimConfig(lr=3e-3))
    assert any(p.ndim == 3 for g in opt.param_groups if g["use_muon"] for p in g["params"])
    tokens = torch.randint(12, 4096, (2, 32), generator=torch.Generator().manual_seed(0))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    losses = []
    for step in range(5):
        opt.zero_grad()
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        if step == 0:
            with_grad = {name for name, p in model.named_parameters() if p.grad is not None}
        opt.step()
        losses.append(loss.item())
        if step == 0:
            unchanged = [n for n, p in model.named_parameters() if n in with_grad and torch.equal(p, before[n])]
            assert not unchanged
            assert len(with_grad) == sum(1 for _ in model.parameters())
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0] - 0.1, losses


# --------------------------------------------------------------------------- fused gate_up_proj (K2: gate, up apart)


class _Fused(nn.Module):
    def __init__(self, experts: int, inter: int, hidden: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.randn(experts, 2 * inter, hidden))  # [E, 2I, H]


class _Separate(nn.Module):
    def __init__(self, fused: Tensor) -> None:
        super().__init__()
        half = fused.shape[-2] // 2
        self.gate_proj = nn.Parameter(fused[:, :half].clone())  # [E, I, H]
        self.up_proj = nn.Parameter(fused[:, half:].clone())


@pytest.mark.parametrize("experts,inter,hidden", [(1, 4, 6), (3, 8, 5), (4, 16, 16)])
def test_fused_gate_up_update_equals_separate_gate_and_up(experts, inter, hidden) -> None:
    """MuonClip on a fused [E, 2I, H] gate_up_proj == MuonClip on separate gate [E, I, H] and up [E, I, H]."""
    torch.manual_seed(0)
    fused = _Fused(experts, inter, hidden)
    separate = _Separate(fused.gate_up_proj.detach())
    cfg = OptimConfig(lr=0.02, weight_decay=0.1)
    opt_fused, opt_sep = build_optimizer(fused, cfg), build_optimizer(separate, cfg)
    for _ in range(3):
        grad = torch.randn(fused.gate_up_proj.shape)
        fused.gate_up_proj.grad = grad.clone()
        separate.gate_proj.grad, separate.up_proj.grad = grad[:, :inter].clone(), grad[:, inter:].clone()
        opt_fused.step()
        opt_sep.step()
    want = torch.cat([separate.gate_proj.detach(), separate.up_proj.detach()], dim=1)
    torch.testing.assert_close(fused.gate_up_proj.detach(), want, rtol=0, atol=1e-6)


def test_fused_gate_up_halves_each_get_the_target_update_rms() -> None:
    """Each half of a fused update has RMS ~ rms_scale (joint NS gave 0.099 / 0.223 on tiny-k2 shapes)."""
    torch.manual_seed(0)
    model = _Fused(4, 32, 16)  # each half [32, 16]; the fused [64, 16] is tall
    start = model.gate_up_proj.detach().clone()
    cfg = OptimConfig(lr=1.0, weight_decay=0.0, momentum=0.0)
    grad = torch.randn(model.gate_up_proj.shape)
    grad[:, :32] *= 10  # one half much larger: joint orthogonalization would give it most of the update
    model.gate_up_proj.grad = grad
    build_optimizer(model, cfg).step()
    delta = start - model.gate_up_proj.detach()
    for half in (delta[:, :32], delta[:, 32:]):
        assert half.pow(2).mean().sqrt().item() == pytest.approx(cfg.rms_scale, rel=0.25)


@pytest.mark.parametrize(
    "name,shape,splits",
    [
        ("model.layers.1.mlp.experts.gate_up_proj", (4, 64, 32), 2),
        ("model.layers.1.mlp.experts.down_proj", (4, 32, 32), 1),
        ("model.layers.0.mlp.gate_proj.weight", (64, 32), 1),
    ],
)
def test_row_splits_table(name, shape, splits) -> None:
    assert row_splits(name, shape, OptimConfig()) == splits


def test_row_splits_rejects_rows_that_do_not_divide() -> None:
    with pytest.raises(ParamSpecError, match="fused_row_splits"):
        row_splits("experts.gate_up_proj", (4, 63, 32), OptimConfig())
