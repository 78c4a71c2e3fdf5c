"""QK-Clip: max-logit recording (vs brute force), exact per-head clipping on GQA / MHA / MLA, stats."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AttentionInterface, GPT2Config, GPT2LMHeadModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from k2post.models.init import build_model
from k2post.models.loading import load_causal_lm
from k2post.optim.config import QKClipConfig
from k2post.optim.qk_clip import (
    MaxLogitRecorder,
    QKClip,
    RowScale,
    apply_qk_clip,
    apply_row_scales,
    compute_qk_clip_stats,
    find_attention_layouts,
    plan_qk_clip,
    recording_real_tokens,
    reduce_per_head_max,
)

CAPTURE_IMPL = "k2post_test_capture_qk"
_CAPTURED: dict[int, tuple[torch.Tensor, torch.Tensor, float]] = {}


def _capture_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """Test attention: keep the exact q, k, scaling that reach sdpa, then run sdpa."""
    _CAPTURED[module.layer_idx] = (query.detach().clone(), key.detach().clone(), scaling)
    return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)


AttentionInterface.register(CAPTURE_IMPL, _capture_attention)
AttentionMaskInterface.register(CAPTURE_IMPL, sdpa_mask)


def _batch(seed: int = 0, batch: int = 3, length: int = 12, padded: bool = False) -> dict[str, torch.Tensor]:
    """Random token ids; with `padded`, row 1 is right-padded and row 2 left-padded."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(20, 2000, (batch, length), generator=gen)
    mask = torch.ones(batch, length, dtype=torch.long)
    if padded:
        mask[1, length - 4 :] = 0
        mask[2, :3] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _brute_force_max(model, batch: dict[str, torch.Tensor]) -> dict[int, torch.Tensor]:
    """max over (b, i, j) of scaling * q_i.k_j per head, from the q/k sdpa sees, full matrices."""
    _CAPTURED.clear()
    model.set_attn_implementation(CAPTURE_IMPL)
    with torch.no_grad():
        model(**batch)
    model.set_attn_implementation("sdpa")
    am = batch["attention_mask"].bool()  # [B, L]
    length = am.shape[1]
    causal = torch.ones(length, length).tril().bool()  # [i, j]: j <= i
    valid = causal[None] & am[:, None, :] & am[:, :, None]  # [B, i, j]
    out = {}
    for idx, (q, k, scaling) in _CAPTURED.items():
        k_full = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # [B, H, L, D]
        logits = scaling * q.double() @ k_full.double().transpose(-1, -2)  # [B, H, L, L]
        logits = logits.masked_fill(~valid[:, None], -math.inf)
        out[idx] = logits.amax(dim=(0, 2, 3)).float()
    return out


def _recorded(model, batch, chunk_bytes: int = 64 * 2**20) -> dict[int, torch.Tensor]:
    with MaxLogitRecorder(chunk_bytes).attach(model) as rec, torch.no_grad():
        model(**batch)
        return rec.per_head()


def _mha_qwen2(tiny_qwen2_dir):
    """tiny-qwen2 rebuilt with num_key_value_heads == num_attention_heads (unshared keys)."""
    config = load_causal_lm(tiny_qwen2_dir).config
    config.num_key_value_heads = config.num_attention_heads
    return build_model(config, seed=1, num_real_tokens=config.vocab_size)


@torch.no_grad()
def _randomize_qk_biases(model, seed: int = 0) -> None:
    """HF initialises biases to zero; give q/k biases values so bias scaling is observable."""
    gen = torch.Generator().manual_seed(seed)
    for layer in model.model.layers:
        for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
            proj.bias.copy_(0.1 * torch.randn(proj.bias.shape, generator=gen))


@torch.no_grad()
def _boost_qwen2_head(model, layer: int, head: int, factor: float) -> None:
    """Multiply a head's q rows (+bias) by `factor`, so its logits grow by `factor`."""
    attn = model.model.layers[layer].self_attn
    rows = slice(head * attn.head_dim, (head + 1) * attn.head_dim)
    attn.q_proj.weight[rows] *= factor
    attn.q_proj.bias[rows] *= factor


@torch.no_grad()
def _boost_mla_head(model, layer: int, head: int, factor: float) -> None:
    """Multiply a head's q rows (nope and rope) of q_b_proj by `factor`."""
    attn = model.model.layers[layer].self_attn
    q_dim = attn.qk_nope_head_dim + attn.qk_rope_head_dim
    attn.q_b_proj.weight[head * q_dim : (head + 1) * q_dim] *= factor


def _snapshot(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _tau_between(per_head: dict[int, torch.Tensor], layer: int, head: int) -> float:
    """A tau under (layer, head)'s max logit and above every other head's."""
    others = max(float(v.max()) for idx, v in per_head.items() if idx != layer)
    same = per_head[layer].clone()
    target = float(same[head])
    same[head] = -math.inf
    others = max(others, float(same.max()))
    assert target > others * 1.5, "setup: the boosted head must dominate"
    return (target + others) / 2


# --------------------------------------------------------------------------- recording


@pytest.mark.parametrize("flavor", ["qwen2", "k2"])
@pytest.mark.parametrize("padded", [False, True])
def test_recorder_matches_brute_force(flavor, padded, tiny_qwen2_dir, tiny_k2_dir):
    model = load_causal_lm(tiny_qwen2_dir if flavor == "qwen2" else tiny_k2_dir)
    batch = _batch(seed=1, padded=padded)
    expected = _brute_force_max(model, batch)
    for chunk_bytes in (64 * 2**20, 1):  # one chunk; one query row per chunk
        got = _recorded(model, batch, chunk_bytes)
        assert sorted(got) == sorted(expected) == list(range(model.config.num_hidden_layers))
        for idx in expected:
            assert got[idx].shape == (model.config.num_attention_heads,)
            torch.testing.assert_close(got[idx], expected[idx], rtol=1e-5, atol=1e-5)


def test_recorder_is_running_max_until_reset(tiny_qwen2_dir):
    model = load_causal_lm(tiny_qwen2_dir)
    a, b = _batch(seed=2), _batch(seed=3)
    rec = MaxLogitRecorder().attach(model)
    with torch.no_grad():
        model(**a)
        model(**b)
    both = rec.per_head()
    rec.reset()
    with rec.paused(), torch.no_grad():
        model(**b)  # not recorded
    assert rec.per_head() == {}
    rec.detach()
    only_a, only_b = _recorded(model, a), _recorded(model, b)
    for idx in both:
        torch.testing.assert_close(both[idx], torch.maximum(only_a[idx], only_b[idx]), rtol=0, atol=0)


@pytest.mark.parametrize("flavor", ["qwen2", "k2"])
def test_recording_leaves_outputs_unchanged(flavor, tiny_qwen2_dir, tiny_k2_dir):
    model = load_causal_lm(tiny_qwen2_dir if flavor == "qwen2" else tiny_k2_dir)
    batch = _batch(seed=4, padded=True)
    with torch.no_grad():
        plain = model(**batch).logits
        with MaxLogitRecorder().attach(model):
            assert model.config._attn_implementation == "k2post_sdpa_maxlogit"
            recorded = model(**batch).logits
    assert model.config._attn_implementation == "sdpa"  # restored on detach
    torch.testing.assert_close(recorded, plain, rtol=0, atol=0)


def test_recorder_with_gradients_and_eager_model(tiny_qwen2_dir):
    """Recording works in a training forward/backward and wraps an eager model's attention too."""
    model = load_causal_lm(tiny_qwen2_dir)
    batch = _batch(seed=5, padded=True)
    expected = _brute_force_max(model, batch)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        plain = model(**batch).logits
    with MaxLogitRecorder().attach(model) as rec:
        assert model.config._attn_implementation == "k2post_eager_maxlogit"
        out = model(**batch, labels=batch["input_ids"])
        out.loss.backward()
        got = rec.per_head()
    assert model.config._attn_implementation == "eager"
    torch.testing.assert_close(out.logits.detach(), plain, rtol=0, atol=0)
    for idx in expected:
        torch.testing.assert_close(got[idx], expected[idx], rtol=1e-5, atol=1e-5)


def test_qkclip_disabled_records_nothing(tiny_qwen2_dir):
    model = load_causal_lm(tiny_qwen2_dir)
    before = _snapshot(model)
    clip = QKClip(model, QKClipConfig(enabled=False, logit_threshold=1e-3))
    assert model.config._attn_implementation == "sdpa"
    with torch.no_grad():
        model(**_batch())
    stats = clip.after_step()
    assert stats.num_heads == 0 and stats.num_clipped == 0
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_unknown_architecture_is_a_clear_error():
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16))
    with pytest.raises(ValueError, match=r"GPT2Attention.*qk_clip.enabled: false"):
        find_attention_layouts(model)
    with pytest.raises(ValueError, match="GPT2Attention"):
        MaxLogitRecorder().attach(model)


# --------------------------------------------------------------------------- clipping


def _clip_one_head_and_check(model, batch, layer: int, head: int) -> tuple[dict, dict, float]:
    """Clip a boosted head; check its new max == tau and every other head is unchanged."""
    before = _recorded(model, batch)
    tau = _tau_between(before, layer, head)
    old = _snapshot(model)
    stats = apply_qk_clip(model, before, tau)
    assert stats.clipped_heads == [(layer, head)]
    after = _recorded(model, batch)
    assert float(after[layer][head]) == pytest.approx(tau, rel=1e-4)
    for idx in before:
        others = [h for h in range(before[idx].numel()) if (idx, h) != (layer, head)]
        torch.testing.assert_close(after[idx][others], before[idx][others], rtol=1e-6, atol=1e-6)
    return old, _snapshot(model), tau / float(before[layer][head])


def _rows_scaled(old, new, name: str, rows: slice, factor: float) -> None:
    """Rows `rows` of param `name` are old * factor exactly; the remaining rows are bit-identical."""
    assert torch.equal(new[name][rows], old[name][rows] * factor)
    keep = torch.ones(old[name].shape[0], dtype=torch.bool)
    keep[rows] = False
    assert torch.equal(new[name][keep], old[name][keep])


def test_gqa_shared_kv_head_scales_only_query_rows(tiny_qwen2_dir):
    model = load_causal_lm(tiny_qwen2_dir)
    layer, head = 3, 1  # kv head 0 is shared by query heads 0 and 1
    _randomize_qk_biases(model)
    _boost_qwen2_head(model, layer, head, 6.0)
    old, new, gamma = _clip_one_head_and_check(model, _batch(seed=6, padded=True), layer, head)
    prefix = f"model.layers.{layer}.self_attn"
    rows = slice(head * 64, (head + 1) * 64)
    _rows_scaled(old, new, f"{prefix}.q_proj.weight", rows, gamma)
    _rows_scaled(old, new, f"{prefix}.q_proj.bias", rows, gamma)
    changed = {n for n in old if not torch.equal(old[n], new[n])}
    assert changed == {f"{prefix}.q_proj.weight", f"{prefix}.q_proj.bias"}


def test_mha_unshared_head_scales_query_and_key_rows(tiny_qwen2_dir):
    model = _mha_qwen2(tiny_qwen2_dir)
    layer, head = 3, 2
    _randomize_qk_biases(model)
    _boost_qwen2_head(model, layer, head, 6.0)
    old, new, gamma = _clip_one_head_and_check(model, _batch(seed=7), layer, head)
    prefix, rows, root = f"model.layers.{layer}.self_attn", slice(head * 64, (head + 1) * 64), math.sqrt(gamma)
    for name in ("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias"):
        _rows_scaled(old, new, f"{prefix}.{name}", rows, root)
    assert len({n for n in old if not torch.equal(old[n], new[n])}) == 4


def test_mla_head_scales_nope_and_rope_rows(tiny_k2_dir):
    model = load_causal_lm(tiny_k2_dir)
    layer, head = 3, 2
    _boost_mla_head(model, layer, head, 8.0)
    old, new, gamma = _clip_one_head_and_check(model, _batch(seed=8, padded=True), layer, head)
    prefix, root = f"model.layers.{layer}.self_attn", math.sqrt(gamma)
    q_name, kv_name = f"{prefix}.q_b_proj.weight", f"{prefix}.kv_b_proj.weight"
    q0, k0 = head * 128, head * 128
    assert torch.equal(new[q_name][q0 : q0 + 64], old[q_name][q0 : q0 + 64] * root)  # q-nope
    assert torch.equal(new[q_name][q0 + 64 : q0 + 128], old[q_name][q0 + 64 : q0 + 128] * gamma)  # q-rope
    other_q = torch.ones(512, dtype=torch.bool)
    other_q[q0 : q0 + 128] = False
    assert torch.equal(new[q_name][other_q], old[q_name][other_q])
    _rows_scaled(old, new, kv_name, slice(k0, k0 + 64), root)  # k-nope scaled, V + other heads kept
    assert torch.equal(new[f"{prefix}.kv_a_proj_with_mqa.weight"], old[f"{prefix}.kv_a_proj_with_mqa.weight"])
    assert {n for n in old if not torch.equal(old[n], new[n])} == {q_name, kv_name}


def test_mla_plan_entries(tiny_k2_dir):
    model = load_causal_lm(tiny_k2_dir)
    per_head = {0: torch.tensor([1.0, 50.0, 1.0, 1.0])}
    plan = plan_qk_clip(model, per_head, tau=10.0)
    prefix = "model.layers.0.self_attn"
    assert plan == [
        RowScale(f"{prefix}.q_b_proj.weight", slice(128, 192), math.sqrt(0.2)),
        RowScale(f"{prefix}.q_b_proj.weight", slice(192, 256), 0.2),
        RowScale(f"{prefix}.kv_b_proj.weight", slice(128, 192), math.sqrt(0.2)),
    ]


def test_heads_at_or_below_tau_are_bit_identical(tiny_qwen2_dir, tiny_k2_dir):
    for path in (tiny_qwen2_dir, tiny_k2_dir):
        model = load_causal_lm(path)
        per_head = _recorded(model, _batch(seed=9))
        tau = max(float(v.max()) for v in per_head.values())  # the top head sits exactly at tau
        before = _snapshot(model)
        assert plan_qk_clip(model, per_head, tau) == []
        stats = apply_qk_clip(model, per_head, tau)
        assert stats.num_clipped == 0
        assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_qkclip_after_step_clips_and_resets(tiny_qwen2_dir):
    model = load_causal_lm(tiny_qwen2_dir)
    _boost_qwen2_head(model, 2, 0, 6.0)
    batch = _batch(seed=10)
    tau = _tau_between(_recorded(model, batch), 2, 0)
    with QKClip(model, QKClipConfig(logit_threshold=tau)) as clip:
        with torch.no_grad():
            model(**batch)
        stats = clip.after_step()
        assert stats.clipped_heads == [(2, 0)]
        assert clip.recorder.per_head() == {}
        with torch.no_grad():
            model(**batch)
        again = clip.after_step()
    assert again.clipped_heads in ([], [(2, 0)])  # at tau up to fp rounding: a no-op re-clip at most
    assert again.max_logit == pytest.approx(tau, rel=1e-4)
    assert model.config._attn_implementation == "sdpa"


def test_apply_row_scales_rejects_unknown_param(tiny_qwen2_dir):
    model = load_causal_lm(tiny_qwen2_dir)
    with pytest.raises(KeyError, match="nope.weight"):
        apply_row_scales(model, [RowScale("nope.weight", slice(0, 1), 0.5)])
    with pytest.raises(ValueError, match="recorded layer 7"):
        plan_qk_clip(model, {7: torch.zeros(4)}, tau=1.0)


# --------------------------------------------------------------------------- stats


def test_stats_and_metrics():
    per_head = {0: torch.tensor([1.0, 5.0, 2.0, 7.0]), 1: torch.tensor([3.0, 4.0, 10.0, float("nan")])}
    stats = compute_qk_clip_stats(per_head, tau=4.0)
    assert stats.clipped_heads == [(0, 1), (0, 3), (1, 2)]
    assert stats.num_clipped == 3 and stats.num_heads == 8 and stats.num_nonfinite == 1
    assert stats.frac_clipped == pytest.approx(3 / 8)
    assert stats.max_logit_per_layer == {0: 7.0, 1: 10.0}
    assert stats.to_metrics() == {
        "qk_clip/max_logit/layer_0": 7.0,
        "qk_clip/max_logit/layer_1": 10.0,
        "qk_clip/max_logit": 10.0,
        "qk_clip/frac_clipped": 3 / 8,
        "qk_clip/num_clipped": 3.0,
        "qk_clip/num_nonfinite": 1.0,
    }


def _reduce_worker(rank: int, init_file: str, out_dir: str) -> None:
    """One gloo rank: all-reduce rank-dependent maxima and save the result."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        mine = {0: torch.tensor([1.0, 5.0 + rank]), 2: torch.tensor([float(3 - 2 * rank), -math.inf])}
        torch.save(reduce_per_head_max(mine), f"{out_dir}/rank{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


def test_reduce_per_head_max_over_ranks(tmp_path):
    """Both ranks end with the elementwise max, so they clip identically."""
    assert reduce_per_head_max({0: torch.ones(2)})[0].tolist() == [1.0, 1.0]  # no process group: identity
    torch.multiprocessing.spawn(_reduce_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2)
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert sorted(got) == [0, 2]
        assert got[0].tolist() == [1.0, 6.0] and got[2].tolist() == [3.0, -math.inf]


# --------------------------------------------------------------------------- padding never enters S_max


def _recorded_padded(model, rows: list[list[int]], pad: int, pad_id: int, real_tokens: bool) -> dict[int, torch.Tensor]:
    """S_max of one forward over `rows` right-padded by `pad` extra tokens, no attention mask (the RL trainer's
    call).
    """
    width = max(map(len, rows)) + pad
    ids = torch.tensor([r + [pad_id] * (width - len(r)) for r in rows])
    valid = torch.arange(width)[None, :] < torch.tensor([len(r) for r in rows])[:, None]
    with MaxLogitRecorder().attach(model) as rec, torch.no_grad():
        with recording_real_tokens(rec, valid if real_tokens else None):
            model(input_ids=ids, use_cache=False)
        return rec.per_head()


@pytest.mark.parametrize("flavor", ["tiny-qwen2", "tiny-k2"])
@pytest.mark.parametrize("pad", [1, 7, 40])
def test_s_max_does_not_change_with_padding(flavor, pad, tiny_qwen2_dir, tiny_k2_dir):
    model = load_causal_lm(tiny_qwen2_dir if flavor == "tiny-qwen2" else tiny_k2_dir).eval()
    rows = [[(7 * i + 3 * t) % 500 + 20 for t in range(n)] for i, n in enumerate([9, 14, 5])]
    base = _recorded_padded(model, rows, 0, 3, real_tokens=True)
    padded = _recorded_padded(model, rows, pad, 3, real_tokens=True)
    for layer in base:
        torch.testing.assert_close(padded[layer], base[layer], rtol=1e-6, atol=1e-6)


def test_padding_counts_without_the_real_token_mask(tiny_qwen2_dir):
    """The bug the mask fixes: padding query rows of a mask-less forward raise S_max."""
    model = load_causal_lm(tiny_qwen2_dir).eval()
    rows = [[(7 * i + 3 * t) % 500 + 20 for t in range(n)] for i, n in enumerate([9, 14, 5])]
    base = _recorded_padded(model, rows, 0, 3, real_tokens=True)
    unmasked = _recorded_padded(model, rows, 40, 3, real_tokens=False)
    assert any(bool((unmasked[layer] > base[layer] + 1e-5).any()) for layer in base)


def test_packed_sft_padding_block_never_enters_s_max(tiny_qwen2_dir):
    """collate's padding block (its own positions) is excluded through batch['token_valid']."""
    from k2post.sft.packing import Example, build_row, collate, model_inputs

    model = load_causal_lm(tiny_qwen2_dir).eval()
    examples = [
        Example(tuple((11 * i + t) % 400 + 20 for t in range(n)), (1,) * n, i, f"e{i}") for i, n in enumerate([6, 9, 4])
    ]
    short, long = build_row(examples[:1]), build_row(examples[1:])

    def smax(rows):
        batch = collate(rows, pad_id=3)
        with MaxLogitRecorder().attach(model) as rec, torch.no_grad():
            with recording_real_tokens(rec, batch["token_valid"]):
                model(**model_inputs(batch))
            return rec.per_head()

    alone = [smax([short]), smax([long])]
    together = smax([short, long])  # the short row gets a 7-token padding block
    for layer in together:
        torch.testing.assert_close(
            together[layer], torch.maximum(alone[0][layer], alone[1][layer]), rtol=1e-5, atol=1e-5
        )


def test_real_token_mask_of_the_wrong_shape_is_a_clear_error(tiny_qwen2_dir):
    model = load_causal_lm(tiny_qwen2_dir).eval()
    with MaxLogitRecorder().attach(model) as rec, torch.no_grad():
        with (
            recording_real_tokens(rec, torch.ones(2, 5, dtype=torch.bool)),
            pytest.raises(ValueError, match="real_tokens mask"),
        ):
            model(input_ids=torch.ones(2, 6, dtype=torch.long), use_cache=False)
