"""Group book, reward shaping, advantages and the step split of k2post.rl.batch (pure, no engines)."""

from __future__ import annotations

import pytest
import torch

from k2post.rl import batch as rb
from k2post.rl.config import BudgetConfig, LengthPenaltyConfig
from k2post.rl.losses import k15_loss


def _sample(group: str, index: int, reward: float, truncated: bool = False, tokens: int = 3) -> rb.Sample:
    return rb.Sample(
        group,
        index,
        "math",
        "math",
        f"t-{group}",
        [1] * (2 + tokens),
        [0, 0] + [1] * tokens,
        reward,
        truncated,
        "env_done",
    )


def test_groups_complete_across_iterations_in_completion_order():
    book = rb.GroupBook(k=2)
    book.open("a"), book.open("b")
    assert book.add([_sample("b", 0, 1.0), _sample("a", 1, 0.0)]) == 0
    assert book.add([_sample("b", 1, 0.0)]) == 1  # b completes first (partial rollout of a continues)
    assert book.add([_sample("a", 0, 1.0)]) == 1
    assert [g[0].group_id for g in book.ready] == ["b", "a"]
    assert [s.index for s in book.ready[1]] == [0, 1]  # ordered by index, not arrival
    assert [g[0].group_id for g in book.take(1)] == ["b"] and len(book.ready) == 1


def test_book_errors_and_drop():
    book = rb.GroupBook(k=2)
    book.open("a")
    with pytest.raises(ValueError, match="already open"):
        book.open("a")
    with pytest.raises(KeyError, match="unknown group 'z'"):
        book.add([_sample("z", 0, 1.0)])
    book.drop(["a"])
    assert not book.open_groups


@pytest.mark.parametrize(
    "penalty, value, rewards, truncated, expected",
    [
        ("replace", 0.0, [1.0, 1.0], [False, True], [1.0, 0.0]),
        ("subtract", 0.5, [1.0, 0.2], [True, False], [0.5, 0.2]),
        ("none", 0.0, [1.0, 0.0], [True, True], [1.0, 0.0]),
    ],
)
def test_budget_shaping(penalty, value, rewards, truncated, expected):
    group = [_sample("g", i, r, t) for i, (r, t) in enumerate(zip(rewards, truncated))]
    budget = BudgetConfig(penalty=penalty, penalty_value=value)
    assert rb.shaped_rewards(group, budget, LengthPenaltyConfig(), 0, 0.5) == pytest.approx(expected)


def test_length_reward_added_after_warmup():
    group = [_sample("g", 0, 1.0, tokens=2), _sample("g", 1, 1.0, tokens=10)]
    length = LengthPenaltyConfig(enabled=True, warmup_iterations=2)
    assert rb.shaped_rewards(group, BudgetConfig(), length, 0, 0.5) == [1.0, 1.0]
    short, long = rb.shaped_rewards(group, BudgetConfig(), length, 3, 0.5)
    assert short > long  # the shorter correct answer gets the bonus


def test_per_sequence_split_equals_grouped_k15_loss():
    """Advantages from the whole group + per-sequence residuals == k15_loss on the same groups."""
    torch.manual_seed(0)
    k, groups = 4, 3
    rewards = torch.rand(groups * k)
    logp_new, logp_old = torch.randn(groups * k, 5), torch.randn(groups * k, 5)
    mask = (torch.rand(groups * k, 5) > 0.3).float()
    reference, _ = k15_loss(logp_new, logp_old, mask, rewards, group_size=k, tau=0.3)
    advantages = [a for g in rewards.view(groups, k).tolist() for a in rb.group_advantages_of(g)]
    logratio = ((logp_new - logp_old) * mask).sum(-1)
    residual = (torch.tensor(advantages) - 0.3 * logratio).pow(2)
    world, gas = 2, 3
    shards = rb.shard_for_ranks(list(range(groups * k)), world)
    scale = rb.micro_loss_scale(groups * k, world, gas)
    per_rank = [
        sum(float(residual[i]) for i in shard) * scale / gas for shard in shards
    ]  # DS: / gas, then mean over ranks
    assert sum(per_rank) / world == pytest.approx(float(reference), rel=1e-6)


def test_step_sequences_shards_and_padding():
    groups = [[_sample("a", 0, 1.0), _sample("a", 1, 0.0)], [_sample("b", 0, 0.5), _sample("b", 1, 0.5)]]
    rows = rb.step_sequences(groups, [[1.0, 0.0], [0.5, 0.5]])
    assert [r.advantage for r in rows] == [0.5, -0.5, 0.0, 0.0] and rows[1].key == "a/1"
    assert rb.shard_for_ranks(rows, 2) == [rows[:2], rows[2:]]
    with pytest.raises(ValueError, match="do not split over 3 ranks"):
        rb.shard_for_ranks(rows, 3)
    assert rb.micro_batches(list(range(5)), 2) == [[0, 1], [2, 3], [4]]
    ids, masks = rb.pad_rows([[1, 2, 3], [4]], [[0, 1, 1], [1]], pad_id=9)
    assert ids == [[1, 2, 3], [4, 9, 9]] and masks == [[0, 1, 1], [1, 0, 0]]


@pytest.mark.parametrize(
    "lengths,size,expected_pad", [([3, 900, 4, 880, 5, 870], 2, 1 + 865 + 20), ([10, 10, 10], 3, 0)]
)
def test_by_length_micro_batches_pad_little_and_keep_every_row(lengths, size, expected_pad):
    rows = [rb.TrainSequence(list(range(n)), [1] * n, float(i), f"g/{i}") for i, n in enumerate(lengths)]
    batches = rb.micro_batches(rb.by_length(rows), size)
    pad = sum(max(len(r.token_ids) for r in b) * len(b) - sum(len(r.token_ids) for r in b) for b in batches)
    assert pad == expected_pad
    assert sorted(r.key for b in batches for r in b) == sorted(r.key for r in rows)


def test_elided_windows_train_with_their_episode_and_do_not_change_the_step_shape():
    """An elided episode's earlier windows: own rows, same advantage, kept with their episode through sharding,
    sorting and micro-batching; N of the 1/N (and the micro-batch count, DeepSpeed's GAS) counts episodes."""
    long = _sample("a", 0, 1.0, tokens=5)
    long.windows = [
        rb.SampleWindow([7, 7, 8], [0, 0, 1], [0], [-0.5]),
        rb.SampleWindow([7, 8, 8], [0, 1, 1], [0, 0], [-1, -1]),
    ]
    groups = [[long, _sample("a", 1, 0.0)], [_sample("b", 0, 0.5, tokens=1), _sample("b", 1, 0.5, tokens=9)]]
    rows = rb.step_sequences(groups, [[1.0, 0.0], [0.5, 0.5]])
    assert [r.key for r in rows] == ["a/0", "a/0#w0", "a/0#w1", "a/1", "b/0", "b/1"]
    assert [r.advantage for r in rows[:3]] == [0.5] * 3 and [r.extra_window for r in rows[:3]] == [False, True, True]
    assert long.response_tokens == 5 + 1 + 2 and rb.main_rows(rows) == 4
    shards = rb.shard_for_ranks(rows, 2)
    assert [[r.key for r in s] for s in shards] == [["a/0", "a/0#w0", "a/0#w1", "a/1"], ["b/0", "b/1"]]
    ordered = rb.by_length(shards[0])
    assert [r.key for r in ordered] == ["a/1", "a/0", "a/0#w0", "a/0#w1"]  # sorted by episode, windows follow
    micro = rb.micro_batches(ordered, 1)
    assert [[r.key for r in m] for m in micro] == [["a/1"], ["a/0", "a/0#w0", "a/0#w1"]]
    old = [[-0.1 * i] for i in range(len(ordered))]  # a parallel list (pi_old per row) chunks the same way
    assert [len(m) for m in rb.micro_batches(old, 1, like=ordered)] == [1, 3]
