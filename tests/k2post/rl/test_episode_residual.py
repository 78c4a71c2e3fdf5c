"""One K1.5 residual per episode (issue 42, A6): an episode elided into context windows trains as several rows, but
its log-ratio is summed over all of them and squared once (`losses.episode_residuals`, which the trainer's
`_micro_loss` calls with `batch.episode_index`).

The policy is a bigram table, so a token's log-prob depends only on the token before it: a window that starts
with the last token of the previous window scores its tokens exactly as the unsplit episode does, and the split
and unsplit episodes must give the same loss and gradient, at theta_old and after an optimizer step."""

from __future__ import annotations

import pytest
import torch

from k2post.rl import batch as rb
from k2post.rl.losses import episode_residuals, k15_residuals, sequence_logprob, shifted_logprobs

TAU = 0.3
PROMPT, RESPONSE = [1, 2], [3, 5, 4, 6, 2, 5, 3]  # one episode's prompt and model-written tokens


class Bigram(torch.nn.Module):
    """Logits of the next token from the previous one."""

    def __init__(self, vocab: int = 8) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(1)))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table[ids]


def sample(split: bool, index: int, response: list[int]) -> rb.Sample:
    """An episode, whole or elided into 3 windows (2 earlier ones + the last, which is the main row)."""
    whole = PROMPT + response
    if not split:
        return rb.Sample("g", index, "math", "math", "t", whole, [0, 0] + [1] * len(response), 0.0, False, "stop")
    # each later window starts with the token before its first trained one (the bigram's whole context)
    windows = [(whole[0:5], [0, 0, 1, 1, 1]), (whole[4:7], [0, 1, 1]), (whole[6:9], [0, 1, 1])]
    main_ids, main_mask = windows[-1]
    earlier = [rb.SampleWindow(ids, mask, [0] * sum(mask), [0.0] * sum(mask)) for ids, mask in windows[:-1]]
    out = rb.Sample("g", index, "math", "math", "t", main_ids, main_mask, 0.0, False, "stop", windows=earlier)
    assert out.response_tokens == len(response)  # the same model tokens, cut into windows
    return out


def rows_of(split: bool) -> list[rb.TrainSequence]:
    """A group of 2 episodes (rewards 1 and 0), the first one split when `split`."""
    group = [sample(split, 0, RESPONSE), sample(False, 1, [4, 4, 6])]
    return rb.step_sequences([group], [[1.0, 0.0]])


def row_logprobs(model: Bigram, rows: list[rb.TrainSequence]) -> torch.Tensor:
    """log pi(y|x) of each row's model tokens. [R]."""
    ids, masks = rb.pad_rows([r.token_ids for r in rows], [r.loss_mask for r in rows], 0)
    ids_t = torch.tensor(ids)
    return sequence_logprob(shifted_logprobs(model(ids_t), ids_t), torch.tensor(masks, dtype=torch.float32))


def loss(model: Bigram, rows: list[rb.TrainSequence], old: torch.Tensor) -> torch.Tensor:
    """The step loss the trainer builds: (1/N) sum over episodes of residual^2 (`episode_residuals`)."""
    advantages = torch.tensor([r.advantage for r in rows if not r.extra_window])
    residual, _ = episode_residuals(
        row_logprobs(model, rows), old, torch.tensor(rb.episode_index(rows)), advantages, TAU
    )
    return residual.pow(2).sum() / rb.kept_episodes(rows)


def loss_and_grad(model: Bigram, rows: list[rb.TrainSequence], old: torch.Tensor) -> tuple[float, torch.Tensor]:
    model.zero_grad()
    value = loss(model, rows, old)
    value.backward()
    return float(value.detach()), model.table.grad.clone()


def test_episode_index_maps_windows_to_their_episode():
    rows = rows_of(split=True)
    assert [r.extra_window for r in rows] == [False, True, True, False]
    assert rb.episode_index(rows) == [0, 0, 0, 1]


def test_split_episode_has_the_unsplit_loss_and_gradient_at_theta_old_and_after_a_step():
    model = Bigram()
    split, whole = rows_of(split=True), rows_of(split=False)
    with torch.no_grad():  # pi_old: the weights at the start of the iteration
        old_split, old_whole = row_logprobs(model, split), row_logprobs(model, whole)
    assert float(old_split[:3].sum()) == pytest.approx(float(old_whole[0]), abs=1e-5)  # same tokens, same log-prob
    at_old_split, at_old_whole = loss_and_grad(model, split, old_split), loss_and_grad(model, whole, old_whole)
    assert at_old_split[0] == pytest.approx(at_old_whole[0]) == pytest.approx((0.5**2 + 0.5**2) / 2)  # A^2 once
    assert torch.allclose(at_old_split[1], at_old_whole[1], atol=1e-5)
    with torch.no_grad():
        model.table -= 2.0 * at_old_whole[1]  # an optimizer step: pi_theta != pi_old
    after_split, after_whole = loss_and_grad(model, split, old_split), loss_and_grad(model, whole, old_whole)
    assert after_split[0] == pytest.approx(after_whole[0], rel=1e-5) and after_whole[0] != pytest.approx(0.25)
    assert torch.allclose(after_split[1], after_whole[1], atol=1e-5)
    # one residual per window (the old rule) counts A^2 three times and gives another gradient
    per_window, _ = k15_residuals(
        row_logprobs(model, split), old_split, torch.tensor([r.advantage for r in split]), TAU
    )
    assert float(per_window.detach().pow(2).sum() / 2) != pytest.approx(after_whole[0], rel=1e-3)


def test_masked_episodes_leave_n_and_the_loss():
    rows = rows_of(split=True)
    for row in rows[:3]:
        row.keep = False  # the IS mask drops the whole split episode
    assert rb.kept_episodes(rows) == 1 and rb.main_rows(rows) == 2


@pytest.mark.parametrize(
    ("new", "old", "episode", "advantages", "residual"),
    [
        ([1.0, 2.0, 3.0], [0.5, 0.5, 0.5], [0, 0, 1], [1.0, -1.0], [1.0 - TAU * 2.0, -1.0 - TAU * 2.5]),
        ([0.0], [0.0], [0], [0.5], [0.5]),
        ([1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0, 0, 0], [0.0], [-3 * TAU]),
    ],
)
def test_episode_residuals_table(new, old, episode, advantages, residual):
    got, logratio = episode_residuals(
        torch.tensor(new), torch.tensor(old), torch.tensor(episode), torch.tensor(advantages), TAU
    )
    assert got.tolist() == pytest.approx(residual)
    assert logratio.tolist() == pytest.approx([(a - r) / TAU for a, r in zip(advantages, residual)])


def test_episode_residuals_refuse_bad_ids():
    with pytest.raises(ValueError, match="episode ids must lie in 0..0"):
        episode_residuals(torch.zeros(2), torch.zeros(2), torch.tensor([0, 1]), torch.zeros(1), TAU)
    with pytest.raises(ValueError, match="episode ids"):
        episode_residuals(torch.zeros(2), torch.zeros(3), torch.tensor([0, 0]), torch.zeros(1), TAU)
