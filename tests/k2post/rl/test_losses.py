"""K1.5 squared-advantage loss and PTX loss: hand tables, the gradient identity at theta_old, masking."""

from __future__ import annotations

import math

import pytest
import torch

from k2post.rl.losses import (
    IGNORE_INDEX,
    group_advantages,
    k15_loss,
    logits_window,
    ptx_loss,
    sequence_logratio,
    shifted_logprobs,
    tail_logprobs,
    temper,
)


@pytest.mark.parametrize(
    ("rewards", "k", "expected"),
    [
        ([1.0, 0.0], 2, [0.5, -0.5]),
        ([1.0, 1.0, 1.0, 0.0], 4, [0.25, 0.25, 0.25, -0.75]),
        ([0.0, 1.0, 3.0, 3.0], 2, [-0.5, 0.5, 0.0, 0.0]),
        ([2.0], 1, [0.0]),
    ],
)
def test_group_advantages(rewards, k, expected):
    assert group_advantages(torch.tensor(rewards), k).tolist() == pytest.approx(expected)


@pytest.mark.parametrize(
    ("logratios", "rewards", "tau", "expected"),
    [
        # at theta = theta_old the loss is the reward variance of each group
        ([0.0, 0.0], [1.0, 0.0], 0.1, (0.25 + 0.25) / 2),
        # (0.5 - 0.1*1)^2 = 0.16, (-0.5 - 0.1*(-2))^2 = 0.09 -> mean 0.125
        ([1.0, -2.0], [1.0, 0.0], 0.1, (0.16 + 0.09) / 2),
        # two prompts: mean of the per-prompt means
        ([0.0, 0.0, 2.0, 0.0], [1.0, 1.0, 0.0, 1.0], 0.5, (0.0 + ((-0.5 - 1.0) ** 2 + 0.25) / 2) / 2),
    ],
)
def test_k15_loss_hand_values(logratios, rewards, tau, expected):
    # one-token responses: the sequence log-ratio is that token's difference
    logp_new = torch.tensor(logratios)[:, None]
    loss, stats = k15_loss(
        logp_new, torch.zeros_like(logp_new), torch.ones_like(logp_new), torch.tensor(rewards), group_size=2, tau=tau
    )
    assert loss.item() == pytest.approx(expected)
    assert stats["rl/loss"] == pytest.approx(expected)


def test_masked_tokens_count_for_nothing():
    logp_new = torch.tensor([[0.3, -1.0, 7.0, 5.0], [0.1, -2.0, -9.0, 0.0]])
    mask = torch.tensor([[1, 1, 0, 0], [0, 1, 1, 0]])
    expected = torch.tensor([0.3 - 1.0, -2.0 - 9.0])
    assert torch.allclose(sequence_logratio(logp_new, torch.zeros_like(logp_new), mask), expected)
    changed = logp_new.clone()
    changed[mask == 0] = 123.0  # prompt / tool-result / padding positions
    rewards = torch.tensor([1.0, 0.0])
    a, _ = k15_loss(logp_new, torch.zeros_like(logp_new), mask, rewards, 2, 0.2)
    b, _ = k15_loss(changed, torch.zeros_like(changed), mask, rewards, 2, 0.2)
    assert a.item() == pytest.approx(b.item())


class ToyPolicy(torch.nn.Module):
    """A bigram policy: logits of the next token from the previous one."""

    def __init__(self, vocab: int = 7):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(0)))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table[ids]  # [N, T, V]


def test_gradient_at_theta_old_is_mean_baseline_policy_gradient():
    torch.manual_seed(0)
    policy, k, tau = ToyPolicy(), 4, 0.3
    ids = torch.randint(0, 7, (8, 6))  # 2 prompts x 4 samples, 6 tokens
    mask = torch.ones(8, 6, dtype=torch.long)
    mask[:, :2] = 0  # prompt tokens
    mask[3, 4:] = 0  # padding
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.2, 0.9, 0.5, 0.1])
    logp = shifted_logprobs(policy(ids), ids)
    loss, _ = k15_loss(logp, logp.detach(), mask, rewards, k, tau)
    grad_loss = torch.autograd.grad(loss, policy.table, retain_graph=True)[0]
    adv = group_advantages(rewards, k)
    seq_logp = (logp * mask).sum(dim=1)
    surrogate = -(2 * tau / k) * (adv * seq_logp).view(-1, k).sum(dim=1).mean()  # averaged over prompts
    grad_pg = torch.autograd.grad(surrogate, policy.table)[0]
    assert torch.allclose(grad_loss, grad_pg, atol=1e-6)
    assert grad_loss.abs().sum() > 0


def test_away_from_theta_old_the_square_brakes():
    logp_old = torch.zeros(2, 1)
    rewards, mask = torch.tensor([1.0, 0.0]), torch.ones(2, 1)
    near, _ = k15_loss(torch.tensor([[0.5], [-0.5]]), logp_old, mask, rewards, 2, 1.0)
    far, _ = k15_loss(torch.tensor([[3.0], [-3.0]]), logp_old, mask, rewards, 2, 1.0)
    assert near.item() < 1e-9 < far.item()  # pushing the good sample too far is penalized


def test_bad_inputs_are_clear_errors():
    x = torch.zeros(3, 2)
    with pytest.raises(ValueError, match="multiple of group_size=2"):
        k15_loss(x, x, x, torch.zeros(3), 2, 0.1)
    with pytest.raises(ValueError, match="must match"):
        sequence_logratio(x, torch.zeros(3, 3), x)
    with pytest.raises(ValueError, match="tau must be > 0"):
        k15_loss(x[:2], x[:2], x[:2], torch.zeros(2), 2, 0.0)


def test_ptx_loss_is_masked_token_nll():
    logits = torch.zeros(1, 4, 5)
    logits[0, 0, 2] = 10.0
    labels = torch.tensor([[IGNORE_INDEX, 2, IGNORE_INDEX, 3]])
    expected = (-torch.log_softmax(logits[0, 0], -1)[2] - torch.log_softmax(logits[0, 2], -1)[3]) / 2
    assert ptx_loss(logits, labels).item() == pytest.approx(expected.item())
    assert ptx_loss(logits, labels).item() == pytest.approx(
        (math.log(1 + 4 * math.exp(-10)) + math.log(5)) / 2, rel=1e-5
    )
    with pytest.raises(ValueError, match="no trained tokens"):
        ptx_loss(logits, torch.full((1, 4), IGNORE_INDEX))


@pytest.mark.parametrize("prompt_lens,length,window", [((3, 5), 9, 7), ((1, 1), 6, 6), ((0, 4), 6, 6), ((8, 8), 9, 2)])
def test_logits_window_starts_at_the_position_that_predicts_the_first_trained_token(prompt_lens, length, window):
    mask = torch.zeros(len(prompt_lens), length)
    for row, start in enumerate(prompt_lens):
        mask[row, start:] = 1
    assert logits_window(mask) == window
    assert logits_window(torch.zeros(2, 5)) == 1


def test_tail_logprobs_equal_the_full_ones_where_anything_is_trained():
    torch.manual_seed(1)
    policy, ids = ToyPolicy(), torch.randint(0, 7, (4, 10))
    mask = torch.zeros(4, 10)
    mask[0, 6:], mask[1, 4:8], mask[2, 9:], mask[3, 5:] = 1, 1, 1, 1
    full = shifted_logprobs(policy(ids), ids)
    keep = logits_window(mask)
    tail = tail_logprobs(policy(ids)[:, -keep:], ids)
    assert keep == 7 and torch.equal(tail * mask, full * mask)
    assert torch.equal(tail[:, 10 - keep + 1 :], full[:, 10 - keep + 1 :]) and not tail[:, : 10 - keep + 1].any()
    with pytest.raises(ValueError, match="tail of 11 logits for 10 tokens"):
        tail_logprobs(torch.zeros(4, 11, 7), ids)


@pytest.mark.parametrize(
    ("logits", "temperature", "expected_logp"),
    [
        ([2.0, 1.0, 0.0], 1.0, torch.log_softmax(torch.tensor([2.0, 1.0, 0.0]), -1).tolist()),
        ([2.0, 1.0, 0.0], 0.5, torch.log_softmax(torch.tensor([4.0, 2.0, 0.0]), -1).tolist()),
        ([2.0, 1.0, 0.0], 0.7, torch.log_softmax(torch.tensor([2.0, 1.0, 0.0]) / 0.7, -1).tolist()),
        # p_T(y) = p(y)^(1/T) / sum_v p(v)^(1/T): hand values for p = (0.5, 0.25, 0.25) at T = 0.5
        (
            [math.log(0.5), math.log(0.25), math.log(0.25)],
            0.5,
            [math.log(0.25 / 0.375), *[math.log(0.0625 / 0.375)] * 2],
        ),
        ([0.0, 0.0], 2.0, [math.log(0.5)] * 2),  # uniform stays uniform
    ],
)
def test_tempered_logprobs_are_those_of_the_sampled_distribution(logits, temperature, expected_logp):
    tempered = temper(torch.tensor([[logits]]), torch.tensor([temperature]))  # [1, 1, V]
    assert torch.log_softmax(tempered[0, 0], -1).tolist() == pytest.approx(expected_logp, abs=1e-6)


def test_temper_is_per_row_and_refuses_greedy_and_mismatched_rows():
    logits = torch.randn(3, 4, 5)
    out = temper(logits, torch.tensor([1.0, 0.5, 2.0]))
    assert (
        torch.equal(out[0], logits[0])
        and torch.allclose(out[1], logits[1] * 2)
        and torch.allclose(out[2], logits[2] / 2)
    )
    assert temper(logits, 1.0) is logits and temper(logits, torch.ones(3)) is logits  # T = 1: no copy
    with pytest.raises(ValueError, match="greedy has no distribution"):
        temper(logits, torch.tensor([1.0, 0.0, 1.0]))
    with pytest.raises(ValueError, match="2 rows|3 rows"):
        temper(logits, torch.tensor([1.0, 0.5]))
