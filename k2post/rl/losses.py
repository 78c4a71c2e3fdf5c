"""RL losses as free functions: the Kimi K1.5 squared-advantage objective and the PTX loss.

K1.5 (REFERENCE.md): for a prompt x with K samples y_1..y_K from pi_old and rewards r_i,
r_bar = mean_i r_i,

    L(theta) = (1/K) sum_i ( r_i - r_bar - tau * log(pi_theta(y_i|x) / pi_old(y_i|x)) )^2

where log pi(y|x) is the sum of the response's token log-probs (prompt, tool-result and padding
tokens masked out). At theta = theta_old the gradient is -(2 tau / K) sum_i (r_i - r_bar)
grad log pi_theta(y_i|x): a mean-baseline policy gradient; away from it the square brakes like a
KL term (larger tau = more conservative). Averaged over prompts.

    loss, stats = k15_loss(logp_new, logp_old, mask, rewards, group_size=K, tau=0.1)
    ptx = ptx_loss(logits, labels)          # token-mean NLL on curated data; L_total = L_RL + alpha * ptx

Shapes: logp_* and mask are [N, T] (N = prompts x K samples, grouped consecutively), rewards [N].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def sequence_logratio(logp_new: torch.Tensor, logp_old: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log(pi_new(y|x) / pi_old(y|x)) per sample: masked sum over tokens. [N, T] -> [N]."""
    if logp_new.shape != logp_old.shape or logp_new.shape != mask.shape:
        raise ValueError(f"logp_new {tuple(logp_new.shape)}, logp_old {tuple(logp_old.shape)} and mask {tuple(mask.shape)} must match")
    weights = mask.to(logp_new.dtype)
    return ((logp_new - logp_old.detach()) * weights).sum(dim=-1)


def group_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """r_i - mean of its group of K consecutive samples. [N] -> [N]."""
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be 1-D with a multiple of group_size={group_size} entries, got {tuple(rewards.shape)}")
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
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    advantages = group_advantages(rewards.to(logp_new.dtype), group_size)
    logratio = sequence_logratio(logp_new, logp_old, mask)
    residual = advantages.detach() - tau * logratio  # [N]
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


def shifted_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Log-prob of each token given the ones before it; position 0 gets 0. [N, T, V], [N, T] -> [N, T]."""
    out = torch.zeros(input_ids.shape, dtype=torch.float32, device=logits.device)
    out[:, 1:] = token_logprobs(logits[:, :-1], input_ids[:, 1:])
    return out


def ptx_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Token-mean NLL of `labels` (IGNORE_INDEX = not trained), labels aligned with inputs (shifted here)."""
    shift_logits, shift_labels = logits[:, :-1].float(), labels[:, 1:]
    if (shift_labels != IGNORE_INDEX).sum() == 0:
        raise ValueError("ptx batch has no trained tokens (every label is IGNORE_INDEX)")
    return F.cross_entropy(shift_logits.reshape(-1, shift_logits.shape[-1]), shift_labels.reshape(-1), ignore_index=IGNORE_INDEX)
