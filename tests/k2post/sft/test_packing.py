"""Packing: bin tables, label/position boundaries, and packed forward == separate forwards (qwen2, k2)."""

from __future__ import annotations

import pytest
import torch

from k2post.sft.packing import (
    IGNORE_INDEX,
    Example,
    build_row,
    check_packed_attention,
    collate,
    model_inputs,
    pack_bins,
    pack_examples,
)


@pytest.mark.parametrize(
    "lengths, capacity, bins",
    [
        ([], 8, []),
        ([8], 8, [[0]]),
        ([3, 3, 3], 8, [[0, 1], [2]]),
        ([5, 4, 3], 8, [[0, 2], [1]]),  # 3 goes to the fuller row (best fit)
        ([6, 5, 2, 3], 8, [[0, 2], [1, 3]]),  # 2 fits after 6 exactly; 3 after 5
        ([4, 6, 4, 2], 8, [[0, 2], [1, 3]]),  # arrival order kept inside each row
        ([1, 1, 1, 1, 1], 2, [[0, 1], [2, 3], [4]]),
        ([7, 2, 1], 8, [[0, 2], [1]]),  # 1 fills the 7-row; 2 opens a new one
        ([2, 7, 1, 6], 8, [[0, 3], [1, 2]]),
    ],
)
def test_pack_bins_table(lengths, capacity, bins):
    assert pack_bins(lengths, capacity) == bins
    assert all(sum(lengths[i] for i in group) <= capacity for group in bins)
    assert sorted(i for group in bins for i in group) == list(range(len(lengths)))


@pytest.mark.parametrize("lengths, capacity", [([9], 8), ([3, 0], 8), ([1], 0)])
def test_pack_bins_refuses_what_does_not_fit(lengths, capacity):
    with pytest.raises(ValueError, match="never truncated|capacity must be positive"):
        pack_bins(lengths, capacity)


def _example(ids, mask, name="e"):
    return Example(tuple(ids), tuple(mask), id=name)


def test_row_labels_and_positions_restart_per_example():
    a = _example([10, 11, 12, 13], [0, 0, 1, 1], "a")
    b = _example([20, 21, 22], [1, 1, 1], "b")  # mask 1 on its first token: still not predicted from `a`
    row = build_row([a, b])
    assert row.input_ids == [10, 11, 12, 13, 20, 21, 22]
    assert row.position_ids == [0, 1, 2, 3, 0, 1, 2]
    assert row.labels == [IGNORE_INDEX, IGNORE_INDEX, 12, 13, IGNORE_INDEX, 21, 22]
    assert row.lengths == (4, 3) and row.example_ids == ("a", "b") and row.num_label_tokens == 4
    assert a.num_label_tokens + b.num_label_tokens == row.num_label_tokens


def test_collate_pads_as_its_own_block():
    rows = [build_row([_example([5, 6, 7], [0, 1, 1])]), build_row([_example([8], [1])])]
    batch = collate(rows, pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2], [0, 0, 1]]
    assert batch["labels"].tolist() == [[IGNORE_INDEX, 6, 7], [IGNORE_INDEX] * 3]


def test_no_packing_keeps_one_example_per_row():
    examples = [_example([1, 2], [0, 1]), _example([3, 4], [0, 1])]
    assert [r.lengths for r in pack_examples(examples, 8, packing=False)] == [(2,), (2,)]
    assert [r.lengths for r in pack_examples(examples, 8)] == [(2, 2)]


def _random_examples(lengths, vocab=4000, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [
        _example(torch.randint(20, vocab, (n,), generator=gen).tolist(), [0] * (n // 2) + [1] * (n - n // 2), f"x{i}")
        for i, n in enumerate(lengths)
    ]


def _separate_and_packed(model, examples, pad_extra=0):
    """(per-example logits concatenated, packed-row logits without padding)."""
    with torch.no_grad():
        separate = torch.cat(
            [model(input_ids=torch.tensor([e.input_ids]), use_cache=False).logits[0] for e in examples]
        )
        short = build_row([_example([1, 2], [0, 1])])
        padded = build_row(examples)
        batch = collate([padded, short] if pad_extra else [padded], pad_id=0)
        packed = model(**model_inputs(batch)).logits[0, : len(padded)]
    return separate, packed


@pytest.fixture(scope="module", params=["tiny-qwen2", "tiny-k2"])
def tiny_model(request, tiny_qwen2_dir, tiny_k2_dir):
    from k2post.models.loading import load_causal_lm

    path = tiny_qwen2_dir if request.param == "tiny-qwen2" else tiny_k2_dir
    return load_causal_lm(path).eval()


def test_packed_forward_equals_separate_forwards(tiny_model):
    from k2post.sft.trainer import token_loss_sum

    examples = _random_examples([9, 17, 5, 30])
    separate, packed = _separate_and_packed(tiny_model, examples, pad_extra=1)
    assert separate.abs().max() > 0.1
    torch.testing.assert_close(packed, separate, atol=2e-5, rtol=1e-5)
    check_packed_attention(tiny_model)
    row = build_row(examples)  # the loss of the packed row is the sum of the dialogues' losses
    per_example = sum(
        float(
            token_loss_sum(separate[start : start + len(e)][None], torch.tensor([row.labels[start : start + len(e)]]))
        )
        for e, start in zip(examples, [0, 9, 26, 31])
    )
    assert float(token_loss_sum(packed[None], torch.tensor([row.labels]))) == pytest.approx(per_example, rel=1e-5)


def test_packing_with_a_kv_cache_would_leak(tiny_model):
    """Why model_inputs passes use_cache=False: with a cache transformers skips the packed-mask detection."""
    examples = _random_examples([9, 17])
    separate, _ = _separate_and_packed(tiny_model, examples)
    row = build_row(examples)
    with torch.no_grad():
        leaky = tiny_model(
            input_ids=torch.tensor([row.input_ids]), position_ids=torch.tensor([row.position_ids]), use_cache=True
        ).logits[0]
    assert (leaky[9:] - separate[9:]).abs().max() > 1e-2  # the second example attends to the first


def test_packing_with_the_qk_clip_recorder(tiny_model):
    """The QK-Clip recording attention gets the same block-causal mask: logits and per-head maxima match."""
    from k2post.optim.qk_clip import MaxLogitRecorder

    examples = _random_examples([12, 20, 7], seed=1)
    with MaxLogitRecorder().attach(tiny_model) as recorder:
        check_packed_attention(tiny_model)
        separate, packed = _separate_and_packed(tiny_model, examples)
        both = recorder.per_head()
        recorder.reset()
        with torch.no_grad():
            tiny_model(**model_inputs(collate([build_row(examples)], pad_id=0)))
        packed_max = recorder.per_head()
        recorder.reset()
        with torch.no_grad():
            for e in examples:
                tiny_model(input_ids=torch.tensor([e.input_ids]), use_cache=False)
        separate_max = recorder.per_head()
    torch.testing.assert_close(packed, separate, atol=2e-5, rtol=1e-5)
    assert both  # recorded at all
    for layer in separate_max:
        torch.testing.assert_close(packed_max[layer], separate_max[layer], atol=1e-5, rtol=1e-5)


def test_unverified_attention_is_refused(tiny_qwen2_dir):
    from k2post.models.loading import load_causal_lm

    model = load_causal_lm(tiny_qwen2_dir)
    model.config._attn_implementation = "mystery_attention"
    with pytest.raises(ValueError, match="set data.packing: false"):
        check_packed_attention(model)
