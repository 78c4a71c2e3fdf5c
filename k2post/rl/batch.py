"""From finished episodes to trainer batches: groups of K, shaped rewards, advantages, shards.

Pure functions (no engines), tested in tests/k2post/rl/test_batch.py.

    groups = GroupBook(k=4)
    groups.open("i0-p3", n=4)                          # a prompt's K episodes are out
    ready = groups.add(samples)                        # complete groups come back
    rewards = shaped_rewards(group, budget, length_cfg, iteration, threshold)
    seqs = step_sequences(ready_groups, advantages)    # TrainSequence rows of one optimizer step
    shards = shard_for_ranks(seqs, world_size)         # rank r trains shards[r]

The K1.5 loss of a step is (1/(G*K)) sum_i (A_i - tau * logratio_i)^2 over its G groups: with
the advantages A_i computed here from the whole group, it splits over sequences, so micro-batches
and ranks may cut groups anywhere (`micro_loss_scale` gives each micro-batch's factor).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from k2post.rl.config import BudgetConfig, LengthPenaltyConfig
from k2post.rl.losses import group_advantages
from k2post.rl.shaping import apply_budget, grouped_length_rewards


@dataclass
class SampleWindow:
    """An earlier context window of an elided episode, as the engine saw and wrote it (docs/ROLLOUT.md)."""

    token_ids: list[int]
    loss_mask: list[int]
    versions: list[int]  # per model-written token
    behaviour_logprobs: list[float]  # per model-written token
    routing: Any = None


@dataclass
class Sample:
    """One finished episode as the trainer needs it."""

    group_id: str
    index: int  # position in its group (0..K-1)
    env_name: str
    task_type: str
    task_id: str
    token_ids: list[int]  # the whole transcript (prompt, model tokens, tool results)
    loss_mask: list[int]  # 1 = model-written token
    reward: float  # the environment's reward (before shaping)
    truncated: bool
    finish_reason: str
    versions: list[int] = field(default_factory=list)  # policy version per model-written token
    reward_error: str | None = None
    behaviour_logprobs: list[float] = field(default_factory=list)  # the engine's log mu(y_t) per model-written token
    response_text: str = ""  # the last assistant message (single-turn: the response; feeds the critic's closed loop)
    turns: int = 1  # assistant turns of the episode
    tool_calls: int = 0  # well-formed tool calls
    malformed_calls: int = 0  # tool calls the parser refused
    tool_errors: int = 0  # well-formed calls the environment answered with an error
    routing: Any = None  # routing_replay: the engine's experts per token, int16 [len(token_ids), moe_layers, top_k]
    reasoning_tokens: int = 0  # model-written tokens inside <think>...</think>
    windows: list[SampleWindow] = field(default_factory=list)  # context management: earlier windows, in order
    context: dict[str, int] = field(default_factory=dict)  # `episode_context_stats` (windows, elisions, ...)
    checkpoint_pass_rate: float | None = None  # the env's `Reward.info["checkpoint_pass_rate"]`, when it reports one
    temperature: float = 1.0  # the sampling temperature of every token of the episode (it decays over iterations)
    infra_failure: bool = False  # its scoring failed for an infrastructure reason (after a re-score): never trained on

    @property
    def response_tokens(self) -> int:
        """Model-written tokens (over every window)."""
        return int(sum(self.loss_mask)) + sum(int(sum(w.loss_mask)) for w in self.windows)


@dataclass
class TrainSequence:
    """One row of a trainer batch: tokens, mask, the advantage A_i, and what the engine saw when it sampled."""

    token_ids: list[int]
    loss_mask: list[int]
    advantage: float
    key: str  # group_id/index
    behaviour_logprobs: list[float] = field(default_factory=list)  # engine log mu(y_t) per model token (may be [])
    versions: list[int] = field(default_factory=list)  # policy version per model token
    token_weights: list[float] | None = None  # IS weight per model token (None: all 1; `consistency.is_weights`)
    keep: bool = True  # false: the IS sequence mask dropped it (no loss, no gradient)
    routing: Any = None  # routing_replay: engine experts per token, int16 [len(token_ids), moe_layers, top_k]
    extra_window: bool = False  # an earlier window of the episode whose main row precedes it (same advantage)
    temperature: float = 1.0  # the sampling temperature: pi_old and pi_theta are softmax(logits / temperature)
    scored: bool = True  # false: an episode whose scoring failed (infrastructure): kept for the batch's shape only,
    # always masked (keep=False: no loss, no gradient, not in N) and left out of its group's mean


class GroupBook:
    """Tracks prompt groups whose K episodes finish at different iterations (partial rollout)."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.open_groups: dict[str, dict[int, Sample]] = {}
        self.ready: list[list[Sample]] = []  # complete groups not yet trained on, in completion order

    def open(self, group_id: str) -> None:
        """A new group whose K episodes are being rolled out."""
        if group_id in self.open_groups:
            raise ValueError(f"group {group_id!r} is already open")
        self.open_groups[group_id] = {}

    def add(self, samples: Sequence[Sample]) -> int:
        """File finished samples; complete groups move to `ready`. Returns how many completed."""
        completed = 0
        for sample in samples:
            group = self.open_groups.get(sample.group_id)
            if group is None:
                raise KeyError(f"sample of unknown group {sample.group_id!r}")
            group[sample.index] = sample
            if len(group) == self.k:
                self.ready.append([group[i] for i in range(self.k)])
                del self.open_groups[sample.group_id]
                completed += 1
        return completed

    def drop(self, group_ids: Sequence[str]) -> None:
        """Forget open groups (their episodes were lost with a dead actor)."""
        for group_id in group_ids:
            self.open_groups.pop(group_id, None)

    def discard(self, keep: Any) -> int:
        """Remove ready groups for which `keep(group)` is false; returns how many went."""
        before = len(self.ready)
        self.ready = [group for group in self.ready if keep(group)]
        return before - len(self.ready)

    def take(self, n_groups: int) -> list[list[Sample]]:
        """The oldest `n_groups` ready groups (removed from `ready`)."""
        taken, self.ready = self.ready[:n_groups], self.ready[n_groups:]
        return taken


MIN_SCORED = 2
"""A group needs this many scored episodes (infrastructure failures left out) to be trained on: the mean baseline
of one episode is itself."""


def scored(group: Sequence[Sample]) -> list[Sample]:
    """The group's episodes whose reward was computed (infrastructure failures left out)."""
    return [sample for sample in group if not sample.infra_failure]


def trainable(group: Sequence[Sample]) -> bool:
    """Whether enough of the group was scored to train on it (`MIN_SCORED`)."""
    return len(scored(group)) >= MIN_SCORED


def shaped_rewards(
    group: Sequence[Sample], budget: BudgetConfig, length: LengthPenaltyConfig, iteration: int, threshold: float
) -> list[float]:
    """Rewards of one group after budget control (truncated -> penalty) and the optional length reward. Give it
    the scored episodes only (`scored`): an infrastructure failure's 0 is no reward."""
    rewards = apply_budget([s.reward for s in group], [s.truncated for s in group], budget)
    if length.enabled:
        correct = [s.reward >= threshold for s in group]
        bonus = grouped_length_rewards([s.response_tokens for s in group], correct, len(group), length, iteration)
        rewards = [r + b for r, b in zip(rewards, bonus)]
    return rewards


def group_advantages_of(rewards: Sequence[float]) -> list[float]:
    """r_i - mean(r) within one group: `losses.group_advantages` (the one definition) on a float64 copy."""
    return group_advantages(torch.tensor(list(rewards), dtype=torch.float64), len(rewards)).tolist()


def sample_rows(sample: Sample, advantage: float) -> list[TrainSequence]:
    """A sample's rows: its (last) window, then each earlier window of an elided episode, all with its advantage."""
    key = f"{sample.group_id}/{sample.index}"
    main = TrainSequence(
        sample.token_ids,
        sample.loss_mask,
        advantage,
        key,
        behaviour_logprobs=sample.behaviour_logprobs,
        versions=sample.versions,
        routing=sample.routing,
        temperature=sample.temperature,
    )
    extra = [
        TrainSequence(
            w.token_ids,
            w.loss_mask,
            advantage,
            f"{key}#w{j}",
            w.behaviour_logprobs,
            w.versions,
            routing=w.routing,
            extra_window=True,
            temperature=sample.temperature,
        )
        for j, w in enumerate(sample.windows)
    ]
    return [main, *extra]


def step_sequences(groups: Sequence[Sequence[Sample]], rewards: Sequence[Sequence[float]]) -> list[TrainSequence]:
    """The sequences of one optimizer step, with their advantages (group order kept; an elided episode's earlier
    windows right after its main row). `rewards`: per group, the shaped rewards of its scored episodes; an
    infrastructure failure keeps its place (the step's shape) as rows with `scored=False`, advantage 0."""
    rows = []
    for group, group_rewards in zip(groups, rewards):
        advantages = iter(group_advantages_of(group_rewards))
        for sample in group:
            if sample.infra_failure:
                rows += [replace(row, scored=False, keep=False) for row in sample_rows(sample, 0.0)]
            else:
                rows += sample_rows(sample, next(advantages))
    return rows


def episode_units(rows: Sequence[Any], like: Sequence[Any] | None = None) -> list[list[Any]]:
    """`rows` cut into episodes: each main row with the extra windows after it. `like`: the TrainSequence rows
    whose structure to follow when `rows` is a parallel list (e.g. their pi_old log-probs)."""
    structure = rows if like is None else like
    starts = [i for i, row in enumerate(structure) if not getattr(row, "extra_window", False)]
    return [list(rows[a:b]) for a, b in zip(starts, [*starts[1:], len(rows)])]


def episode_index(rows: Sequence[Any]) -> list[int]:
    """Per row, the position of its episode among `rows` (extra windows share their main row's): the grouping that
    sums an episode's log-ratio over its windows (`losses.episode_residuals`)."""
    out, episode = [], -1
    for row in rows:
        episode += not getattr(row, "extra_window", False)
        out.append(max(episode, 0))
    return out


def main_rows(rows: Sequence[Any]) -> int:
    """Episodes among `rows` (extra windows not counted): the N of the K1.5 loss's 1/N."""
    return sum(not getattr(row, "extra_window", False) for row in rows)


def kept_episodes(rows: Sequence[Any]) -> int:
    """Episodes among `rows` the IS mask kept: the N of the K1.5 loss's 1/N (a masked episode is left out of the
    mean, as if never sampled, so the kept ones' gradient keeps its scale)."""
    return sum(bool(getattr(row, "keep", True)) for row in rows if not getattr(row, "extra_window", False))


def shard_for_ranks(rows: Sequence[Any], world_size: int) -> list[list[Any]]:
    """Contiguous, equal shards of episodes (their windows stay together; episodes must divide evenly: the config
    guarantees it)."""
    units = episode_units(rows)
    if len(units) % world_size:
        raise ValueError(f"{len(units)} sequences do not split over {world_size} ranks")
    size = len(units) // world_size
    return [[row for unit in units[r * size : (r + 1) * size] for row in unit] for r in range(world_size)]


def by_length(rows: Sequence[TrainSequence]) -> list[TrainSequence]:
    """Episodes sorted by their main row's token count (stable), so micro-batches pad little: the K1.5 loss of a
    step is a per-sequence sum once advantages are known, so the order within a rank's shard does not matter."""
    units = sorted(episode_units(rows), key=lambda unit: len(unit[0].token_ids))
    return [row for unit in units for row in unit]


def micro_batches(rows: Sequence[Any], size: int, like: Sequence[Any] | None = None) -> list[list[Any]]:
    """Consecutive micro-batches of at most `size` episodes (an episode's windows ride along with it, so the
    number of micro-batches, DeepSpeed's gradient accumulation, stays what the config says)."""
    units = episode_units(rows, like)
    return [[row for unit in units[i : i + size] for row in unit] for i in range(0, len(units), size)]


def micro_loss_scale(step_sequences_total: int, world_size: int, gas: int) -> float:
    """Factor on a micro-batch's sum of squared residuals so that DeepSpeed (which divides by gas
    and averages over ranks) ends with the gradient of (1/N) sum_i residual_i^2 over the step's N."""
    return world_size * gas / step_sequences_total


def pad_rows(
    token_ids: Sequence[Sequence[int]], loss_masks: Sequence[Sequence[int]], pad_id: int
) -> tuple[list[list[int]], list[list[int]]]:
    """Right-pad to the longest row (padding is masked out; causal attention never reads it)."""
    width = max(len(ids) for ids in token_ids)
    ids = [list(row) + [pad_id] * (width - len(row)) for row in token_ids]
    masks = [list(mask) + [0] * (width - len(mask)) for mask in loss_masks]
    return ids, masks
