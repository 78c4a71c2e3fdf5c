"""RL losses as free functions: the Kimi K1.5 squared-advantage objective and the PTX loss.

K1.5 (Kimi K1.5, arXiv 2501.12599; K2 uses it): for a prompt x with K samples y_1..y_K from pi_old and rewards r_i,
r_bar = mean_i r_i,

    L(theta) = (1/K) sum_i ( r_i - r_bar - tau * log(pi_theta(y_i|x) / pi_old(y_i|x)) )^2

where log pi(y|x) is the sum of the response's token log-probs (prompt, tool-result and padding
tokens masked out). At theta = theta_old the gradient is -(2 tau / K) sum_i (r_i - r_bar)
grad log pi_theta(y_i|x): a mean-baseline policy gradient; away from it the square brakes like a
KL term (larger tau = more conservative). Averaged over prompts.

    loss, stats = k15_loss(logp_new, logp_old, mask, rewards, group_size=K, tau=0.1)
    ptx = ptx_loss(logits, labels)          # token-mean NLL on curated data; L_total = L_RL + alpha * ptx

Shapes: logp_* and mask are [N, T] (N = prompts x K samples, grouped consecutively), rewards [N].

The trainer (k2post/rl/trainer.py) trains micro-batches that may cut groups, so it computes the
advantages of whole groups first and calls the per-sequence pieces `sequence_logprob` and
`episode_residuals` (`k15_residuals` once per episode, its log-ratio summed over its context windows) that
`k15_loss` is built from: sum_i residual_i^2 / N over a step is exactly
`k15_loss` when every group has K samples (tests/k2post/rl/test_trainer_gradient.py checks the
DeepSpeed trainer's gradient against autograd of `k15_loss` + `ptx_loss`). `token_entropy` gives
the policy-entropy diagnostic from the same logits. `temper` turns logits into those of the distribution the
engine sampled (logits / T), so pi_old and pi_theta are the sampled policy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def sequence_logprob(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log pi(y|x) per sample: the masked sum of token log-probs. [N, T], [N, T] -> [N]."""
    if logp.shape != mask.shape:
        raise ValueError(f"logp {tuple(logp.shape)} and mask {tuple(mask.shape)} must match")
    return (logp * mask.to(logp.dtype)).sum(dim=-1)


def sequence_logratio(logp_new: torch.Tensor, logp_old: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log(pi_new(y|x) / pi_old(y|x)) per sample: masked sum over tokens. [N, T] -> [N]."""
    if logp_new.shape != logp_old.shape:
        raise ValueError(f"logp_new {tuple(logp_new.shape)} and logp_old {tuple(logp_old.shape)} must match")
    return sequence_logprob(logp_new, mask) - sequence_logprob(logp_old.detach(), mask)


def k15_residuals(
    seq_logp_new: torch.Tensor, seq_logp_old: torch.Tensor, advantages: torch.Tensor, tau: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(residual_i = A_i - tau * (log pi_new - log pi_old)(y_i|x), the log-ratio) per sample. [N] each.

    Advantages and pi_old are constants (detached); the K1.5 loss is the mean of residual^2."""
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    logratio = seq_logp_new - seq_logp_old.detach()
    return advantages.detach().to(seq_logp_new.dtype) - tau * logratio, logratio


def episode_residuals(
    row_logp_new: torch.Tensor,
    row_logp_old: torch.Tensor,
    episode_of_row: torch.Tensor,
    advantages: torch.Tensor,
    tau: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """K1.5 residuals of episodes whose tokens lie in several rows (context windows of an elided episode):
    each episode's log-ratio is summed over all its rows, then `k15_residuals` once per episode, so A_i enters the
    square once. [R], [R], [R] (episode position of each row, 0..E-1), [E] -> residual [E], log-ratio [E]."""
    count = advantages.shape[0]
    if not (row_logp_new.shape == row_logp_old.shape == episode_of_row.shape):
        raise ValueError(
            f"{tuple(row_logp_new.shape)} new, {tuple(row_logp_old.shape)} old log-probs for "
            f"{tuple(episode_of_row.shape)} episode ids"
        )
    if episode_of_row.numel() and not 0 <= int(episode_of_row.min()) <= int(episode_of_row.max()) < count:
        raise ValueError(f"episode ids must lie in 0..{count - 1}, got {episode_of_row.tolist()}")
    new = torch.zeros(count, dtype=row_logp_new.dtype, device=row_logp_new.device).index_add(
        0, episode_of_row, row_logp_new
    )
    old = torch.zeros(count, dtype=row_logp_new.dtype, device=row_logp_new.device).index_add(
        0, episode_of_row, row_logp_old.detach().to(row_logp_new.dtype)
    )
    return k15_residuals(new, old, advantages, tau)


def group_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """r_i - mean of its group of K consecutive samples. [N] -> [N]."""
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards must be 1-D with a multiple of group_size={group_size} entries, got {tuple(rewards.shape)}"
        )
    grouped = rewards.view(-1, group_size)
    return (grouped - grouped.mean(dim=1, keepdim=True)).view(-1)


def k15_loss(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    mask: torch.Tensor,
    rewards: torch.Tensor,
    group_size: int,
    tau: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The K1.5 squared-advantage loss (mean over prompts of the mean over its K samples)."""
    advantages = group_advantages(rewards.to(logp_new.dtype), group_size)
    if logp_new.shape != logp_old.shape:
        raise ValueError(f"logp_new {tuple(logp_new.shape)} and logp_old {tuple(logp_old.shape)} must match")
    residual, logratio = k15_residuals(
        sequence_logprob(logp_new, mask), sequence_logprob(logp_old, mask), advantages, tau
    )  # [N]
    loss = residual.pow(2).view(-1, group_size).mean(dim=1).mean()
    stats = {
        "rl/loss": float(loss.detach()),
        "rl/logratio_mean": float(logratio.detach().mean()),
        "rl/logratio_abs_max": float(logratio.detach().abs().max()),
        "rl/advantage_abs_mean": float(advantages.abs().mean()),
    }
    return loss, stats


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log p(tokens[t] | ...) from logits that predict them. [N, T, V], [N, T] -> [N, T] (fp32)."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def temper(logits: torch.Tensor, temperatures: torch.Tensor | float) -> torch.Tensor:
    """Logits of the distribution a row was sampled from: logits / T (per row). The trained policy pi is
    softmax(logits / T), what the engine sampled and reports (vLLM's processed log-probs). T = 0 (greedy) has no
    sampling distribution and is refused: RL samples at T > 0. [N, L, V], [N] or float -> [N, L, V]."""
    temps = torch.as_tensor(temperatures, dtype=torch.float32, device=logits.device)
    if bool((temps <= 0).any()):
        raise ValueError(f"temperature must be > 0 to train on a sample (greedy has no distribution), got {temps}")
    if temps.ndim == 0:
        return logits if float(temps) == 1.0 else logits / temps
    if temps.shape != logits.shape[:1]:
        raise ValueError(f"{tuple(temps.shape)} temperatures for {logits.shape[0]} rows")
    if bool((temps == 1.0).all()):
        return logits
    return logits / temps.to(logits.dtype)[:, None, None]


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the next-token distribution at each position (nats, fp32). [N, T, V] -> [N, T]."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def shifted_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Log-prob of each token given the ones before it; position 0 gets 0. [N, T, V], [N, T] -> [N, T]."""
    out = torch.zeros(input_ids.shape, dtype=torch.float32, device=logits.device)
    out[:, 1:] = token_logprobs(logits[:, :-1], input_ids[:, 1:])
    return out


def logits_window(mask: torch.Tensor) -> int:
    """How many trailing positions' logits a batch needs: from the one that predicts its first trained
    token to the end (`logits_to_keep` of a HF forward; the prompt positions before it need none). [N, T] -> int."""
    trained = mask.bool().any(dim=0).nonzero()
    if trained.numel() == 0:
        return 1
    return mask.shape[1] - max(int(trained[0]) - 1, 0)


def tail_logprobs(tail_logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """`shifted_logprobs` from the logits of the last L positions only; earlier positions get 0.
    [N, L, V], [N, T] -> [N, T].
    """
    window, length = tail_logits.shape[1], input_ids.shape[1]
    if not 1 <= window <= length:
        raise ValueError(f"tail of {window} logits for {length} tokens")
    out = torch.zeros(input_ids.shape, dtype=torch.float32, device=tail_logits.device)
    start = length - window
    out[:, start + 1 :] = token_logprobs(tail_logits[:, :-1], input_ids[:, start + 1 :])
    return out


def masked_token_lists(token_logp: torch.Tensor, mask: torch.Tensor) -> list[list[float]]:
    """Per row, the values at its mask == 1 positions, in order (a row's model-token log-probs). [N, T] -> N lists."""
    return [row[keep.bool()].tolist() for row, keep in zip(token_logp, mask)]


def weight_matrix(mask: torch.Tensor, weights: list[list[float] | None]) -> torch.Tensor:
    """`mask` [N, T] with each row's mask == 1 positions replaced by its per-token weights (None: kept at 1)."""
    out = mask.clone()
    for row, row_weights in enumerate(weights):
        if row_weights is not None:
            positions = mask[row].bool()
            if int(positions.sum()) != len(row_weights):
                raise ValueError(f"row {row}: {len(row_weights)} token weights for {int(positions.sum())} model tokens")
            out[row, positions] = torch.tensor(row_weights, dtype=out.dtype, device=out.device)
    return out


def ptx_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Token-mean NLL of `labels` (IGNORE_INDEX = not trained), labels aligned with inputs (shifted here)."""
    shift_logits, shift_labels = logits[:, :-1].float(), labels[:, 1:]
    if (shift_labels != IGNORE_INDEX).sum() == 0:
        raise ValueError("ptx batch has no trained tokens (every label is IGNORE_INDEX)")
    return F.cross_entropy(
        shift_logits.reshape(-1, shift_logits.shape[-1]), shift_labels.reshape(-1), ignore_index=IGNORE_INDEX
    )
