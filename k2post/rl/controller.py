"""The RL controller: one process driving the trainer ranks and rollout replicas, iteration by iteration.

    run = RLRun(load_run_config("configs/rl_demo.yaml", expected_kind="rl"))
    summary = run.run()           # setup, resume, iterations, final model, plots, summary.json

Per iteration (`RLRun.iteration`, docs/RL.md):
  1. draw prompts from the environment mix (`PromptPools`: prioritized / curriculum sampling per environment);
  2. queue K episodes per prompt on the rollout replicas (per-task-type temperature and token budget,
     per-episode seeds: `EpisodeOptions`) and step every queued or paused episode one iteration (partial
     rollout: unfinished ones stay paused in their replica);
  3. score finished episodes in the RewardPool's isolated worker processes (group-scored envs: on the replica);
  4. complete groups of K -> shaped rewards (budget penalty, length reward) -> advantages;
  5. engines sleep; trainer ranks compute pi_old log-probs and take MuonClip steps on K1.5 + PTX;
  6. engines wake; every trainer rank pushes the weights to its replica (checkpoint engine);
  7. metrics (time and memory per phase, tokens/s and MFU: `perf/*`), held-out eval, checkpoint
     (`ControllerState.save`).
A dead replica is restarted (`RolloutGroup.restart`), its open groups dropped and the weights re-pushed (`recover`).

The actors sit behind `k2post/rl/actors.py` (the only Ray code); tests/k2post/rl/test_controller.py runs this
loop with in-process fakes of those facades.
"""

from __future__ import annotations

import contextlib
import logging
import time
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from k2post.config.loader import dump_yaml
from k2post.envs.base import Task
from k2post.envs.reward_errors import check_error_fraction, describe_errors
from k2post.evaluation.heldout import eval_work, final_text, mean_accuracy, score_items, summarize
from k2post.rl import batch as rb
from k2post.rl.actors import RayCluster, Work
from k2post.rl.config import ISCorrectionConfig
from k2post.rl.consistency import consistency_metrics, is_weights, weighted_sum
from k2post.rl.critic_loop import group_of, judge_calls, judged_rewards
from k2post.rl.diagnostics import agentic_metrics, group_diagnostics, group_has_signal
from k2post.rl.metrics import (
    PerfModel,
    RunLog,
    dump_json,
    ledger_digest,
    perf_model,
    read_metrics,
    rollout_perf,
    summary_of,
    train_perf,
    write_plots,
)
from k2post.rl.prompts import PromptPools
from k2post.rl.run_config import RLConfig
from k2post.rl.schedules import temperature_for
from k2post.rl.state import ControllerState, latest_checkpoint, publish_final
from k2post.rollout.agentic import EpisodeOptions, episode_context_stats, episode_tool_stats
from k2post.train.metrics import perf_text
from k2post.train.mfu import head_positions

log = logging.getLogger(__name__)
__all__ = ["ControllerState", "PhaseTimer", "RLRun", "RLRunDirError"]  # ControllerState: old pickles name it here


class RLRunDirError(ValueError):
    """run_dir holds an earlier run and resume is off."""


class PhaseTimer:
    """Wall time per named phase of one iteration."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started


def episode_seed(run_seed: int, key: str) -> int:
    """A stable per-episode sampling seed (same on resume)."""
    return zlib.crc32(f"{run_seed}:{key}".encode()) & 0x7FFFFFFF


def apply_is_correction(
    shards: list[list[rb.TrainSequence]], old: list[dict[str, Any]], cfg: ISCorrectionConfig
) -> tuple[list[list[float]], list[bool]]:
    """Set each row's IS token weights and each episode's mask (`consistency.is_weights` over all the episode's
    context windows at once: one keep flag per episode) from pi_old's token log-probs (`old`: one `old_policy`
    result per rank); returns each rank's per-row pi_old terms sum_t w_t log pi_old(y_t) (what `train_step` takes)
    and every episode's keep flag. Rows without engine log-probs keep weight 1."""
    olds, keeps = [], []
    for shard, result in zip(shards, old):
        terms = []
        for unit, tokens in zip(rb.episode_units(shard), rb.episode_units(result["token_logprobs"], like=shard)):
            keeps.append(_correct_episode(unit, tokens, cfg, terms))
        olds.append(terms)
    return olds, keeps


def _correct_episode(
    rows: list[rb.TrainSequence], tokens: list[list[float]], cfg: ISCorrectionConfig, terms: list[float]
) -> bool:
    """One episode's weights and keep flag (set on every row of it); appends each row's pi_old term to `terms`."""
    behaviour = [r.behaviour_logprobs if len(r.behaviour_logprobs) == len(t) else t for r, t in zip(rows, tokens)]
    weights, keep = is_weights([x for t in tokens for x in t], [x for b in behaviour for x in b], cfg)
    start = 0
    for row, row_tokens in zip(rows, tokens):
        row_weights = weights[start : start + len(row_tokens)]
        start += len(row_tokens)
        row.keep, row.token_weights = keep and row.scored, row_weights if cfg.enabled else None
        terms.append(weighted_sum(row_tokens, row_weights))
    return keep and all(row.scored for row in rows)


def step_consistency(
    rows: list[rb.TrainSequence], old_tokens: list[list[float]], version: int, keeps: list[bool], cap: float | None
) -> dict[str, float]:
    """`consistency/*` of the trained rows that carry engine log-probs (`consistency.consistency_metrics`)."""
    pairs = [(r, t) for r, t in zip(rows, old_tokens) if len(r.behaviour_logprobs) == len(t)]
    return consistency_metrics(
        [t for _, t in pairs],
        [r.behaviour_logprobs for r, _ in pairs],
        [r.versions for r, _ in pairs],
        version,
        keeps,
        cap,
    )


def warn_masked(checks: dict[str, float], cfg: ISCorrectionConfig) -> bool:
    """Log one warning line when the IS mask dropped more than `warn_masked_share` of the episodes; returns whether."""
    share = checks.get("consistency/masked_share", 0.0)
    if not cfg.enabled or not cfg.sequence_mask or share <= cfg.warn_masked_share:
        return False
    log.warning(
        "IS mask dropped %d of %d episodes (%.0f%% > warn_masked_share %.0f%%): the engine and the trainer disagree "
        "(kl %.2e); check engine dtype, temperature, routing replay and stale weights",
        int(checks["consistency/masked_episodes"]),
        int(checks["consistency/episodes"]),
        100 * share,
        100 * cfg.warn_masked_share,
        checks.get("consistency/kl", float("nan")),
    )
    return True


def routing_metrics(results: list[dict[str, Any]]) -> dict[str, float]:
    """`routing/*`: the share of recorded tokens whose trainer top-k differed from the engine's (own choice, and
    the experts used: 0 under routing replay), summed over the ranks' pi_old forwards."""
    tokens = sum(r["routing"]["tokens"] for r in results)
    if not tokens:
        return {}
    return {
        "routing/disagree": sum(r["routing"]["disagree"] for r in results) / tokens,
        "routing/disagree_used": sum(r["routing"]["disagree_used"] for r in results) / tokens,
        "routing/tokens": float(tokens),
    }


def ledger_row(ledger: dict[str, list[str]]) -> dict[str, Any]:
    """`ledger/<what>` (a digest of the ids) and `ledger/<what>_n` (their count) for each list of ids."""
    return {
        key: value
        for what, ids in ledger.items()
        for key, value in ((f"ledger/{what}", ledger_digest(ids)), (f"ledger/{what}_n", len(ids)))
    }


def progress_line(row: dict[str, Any], done: int, end: int, seconds_per_it: float) -> str:
    """One line per logged iteration when no progress bar is shown (logs, `ray job` output)."""
    evals = f" eval {row['eval/mean_accuracy']:.3f}" if "eval/mean_accuracy" in row else ""
    train = perf_text(row, "perf/train_tokens_per_s")
    rollout = perf_text({"perf/tokens_per_s": row.get("perf/rollout_tokens_per_s")})
    return (
        f"rl: iteration {done}/{end} reward {row.get('reward/mean', float('nan')):.3f} "
        f"steps {row.get('train/step_total', 0)}{evals}"
        f"{f' | train {train}' if train else ''}{f' | rollout {rollout}' if rollout else ''}"
        f" ({seconds_per_it:.1f} s/it, eta {seconds_per_it * (end - done) / 60:.1f} min)"
    )


def score_in_chunks(
    score: Any, items: Sequence[Any], names: Sequence[str], chunk: int, limit: float, where: str
) -> list[Any]:
    """`score(items)` chunk by chunk; stops with one line (RewardErrorsExceeded) as soon as more than `limit` of
    the rewards scored so far are errors, so a broken or slow scorer costs one chunk, not the whole eval."""
    rewards: list[Any] = []
    for start in range(0, len(items), chunk):
        rewards += score(items[start : start + chunk])
        errors = [r.error for r in rewards]
        check_error_fraction(names[: len(rewards)], errors, limit, where, "reward.max_reward_error_fraction")
    return rewards


def spread(work: Iterable[tuple[Any, EpisodeOptions]], replicas: int) -> Work:
    """Round-robin (item, options) pairs over `replicas`: per replica (items, options)."""
    parts: Work = [([], []) for _ in range(replicas)]
    for position, (item, options) in enumerate(work):
        parts[position % replicas][0].append(item)
        parts[position % replicas][1].append(options)
    return parts


def step_mean(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The mean over an iteration's optimizer steps of every numeric figure of their rows."""
    return {k: sum(r[k] for r in rows) / len(rows) for k in rows[0] if isinstance(rows[0][k], (int, float))}


def checkpoint_rate(reward: Any) -> float | None:
    """The share of rubric checkpoints an episode passed, when its environment reports one."""
    value = (getattr(reward, "info", None) or {}).get("checkpoint_pass_rate")
    return float(value) if isinstance(value, (int, float)) else None


def sample_window(window: Any) -> rb.SampleWindow:
    """An elided episode's earlier window as the trainer needs it."""
    written = [i for i, m in enumerate(window.loss_mask) if m]
    return rb.SampleWindow(
        list(window.token_ids),
        list(window.loss_mask),
        [window.versions[i] for i in written],
        [float(window.logprobs[i]) for i in written],
        window.routing,
    )


def sampled_temperature(episode: Any) -> float:
    """The temperature the episode's tokens were sampled at (the RL loop sets one per episode; None: the runner's
    default, which RL never leaves unset)."""
    value = getattr(episode, "temperature", None)
    if value is None:
        raise ValueError(f"episode {episode.id!r} has no sampling temperature: RL episodes must set one")
    return float(value)


def to_sample(episode: Any, reward: Any) -> rb.Sample:
    """A finished episode and its reward as a row of the group book."""
    group_id, index = group_of(episode.id)
    written = [i for i, m in enumerate(episode.loss_mask) if m]
    return rb.Sample(
        group_id,
        index,
        episode.env_name,
        episode.task.task_type,
        episode.task.id,
        list(episode.token_ids),
        list(episode.loss_mask),
        float(reward.value),
        episode.truncated,
        str(episode.finish_reason),
        versions=[episode.versions[i] for i in written],
        reward_error=reward.error,
        behaviour_logprobs=[float(episode.logprobs[i]) for i in written],
        response_text=final_text(episode),
        routing=getattr(episode, "routing", None),
        reasoning_tokens=int(getattr(episode, "reasoning_tokens", 0)),
        windows=[sample_window(w) for w in getattr(episode, "windows", [])],
        context=episode_context_stats(episode),
        checkpoint_pass_rate=checkpoint_rate(reward),
        temperature=sampled_temperature(episode),
        infra_failure=bool(getattr(reward, "infra_failure", False)),
        **episode_tool_stats(episode),
    )


class RLRun:
    """One RL run: the trainer and rollout groups (from `cluster`), the prompts, the group book, the run dir."""

    def __init__(self, cfg: RLConfig, cluster: Any = None) -> None:
        self.cfg = cfg
        self.run_dir = Path(cfg.run_dir)
        self.cluster = cluster or RayCluster(cfg)  # tests pass an in-process fake with the same `start`/`close`
        self.state = ControllerState.fresh(cfg.rollout.samples_per_prompt)
        self.envs: dict[str, Any] = {}
        self.prompts: PromptPools | None = None
        self.trainers = self.rollouts = self.reward_pool = self.log = None
        self.ledger: dict[str, list[str]] = {}  # this iteration's ids: prompts drawn, episodes finished, groups trained
        self.perf: PerfModel | None = None  # FLOPs per token and peak FLOP/s of `perf/mfu` (None: no MFU)
        self.infra_dropped = 0  # this iteration's groups with fewer than 2 scored episodes (infrastructure failures)

    # ------------------------------------------------------------------ setup

    def prepare_run_dir(self) -> Path | None:
        """Refuse an earlier run unless resuming; write config.yaml; returns the checkpoint to resume from."""
        earlier = (self.run_dir / "metrics.jsonl").exists() or latest_checkpoint(self.run_dir) is not None
        if earlier and not self.cfg.resume:
            raise RLRunDirError(
                f"run_dir {self.cfg.run_dir!r} already holds a run: continue it with "
                f"`k2post rl --resume {self.cfg.run_dir}` (or `resume: auto`), or pick another run_dir"
            )
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(dump_yaml(self.cfg))
        checkpoint = latest_checkpoint(self.run_dir) if self.cfg.resume else None
        if self.cfg.resume and checkpoint is None:
            log.info("rl: resume: %s, but no checkpoint in %s yet: starting fresh", self.cfg.resume, self.run_dir)
        return checkpoint

    def setup(self) -> None:
        """Everything up to the first iteration (resuming when configured)."""
        from k2post.envs.workers import RewardPool
        from k2post.models.loading import ensure_model

        self.envs = {entry.name: entry.make() for entry in self.cfg.envs}  # first: a sandbox without isolation
        checkpoint = self.prepare_run_dir()  # stops the run before it leaves a run dir behind
        self.prompts = PromptPools(self.cfg, self.envs)
        model_dir = checkpoint or ensure_model(self.cfg.model)
        self.reward_pool = RewardPool(num_workers=self.cfg.reward.workers, timeout_s=self.cfg.reward.timeout_s)
        self.trainers, self.rollouts = self.cluster.start(str(model_dir))
        self.perf = self.perf_model(model_dir)
        self.log = RunLog(self.run_dir)
        if checkpoint is not None:
            self.resume_from(checkpoint)
        else:
            self.log.truncate_after(-1)
        self.trainers.offload(True)  # the engines generate first

    def perf_model(self, model_dir: Path) -> PerfModel | None:
        """The trained model's FLOPs per token (meta-device build of its config) and the trainer device's peak
        FLOP/s (the controller's CUDA device when it sees one, else a CPU matmul measured here); None (no
        `perf/mfu`) when the model dir's config cannot be built."""
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        try:
            perf = perf_model(str(model_dir), self.cfg.model.dtype, device)
        except (ValueError, KeyError, OSError) as err:
            log.warning("no perf/mfu: %s", err)
            return None
        log.info("perf/mfu against %.3g TFLOP/s per trainer rank (%s)", perf.peak_flops / 1e12, perf.peak_source)
        return perf

    # ------------------------------------------------------------------ 1-2: prompts and rollouts

    def episode_options(self, group_id: str, k: int, task: Task, iteration: int) -> EpisodeOptions:
        key = f"{group_id}/{k}"
        return EpisodeOptions(
            id=key,
            seed=episode_seed(self.cfg.seed, key),
            temperature=temperature_for(self.cfg.temperature, task.task_type, iteration),
            max_tokens=self.cfg.budget.budget_for(task.task_type),
            max_reasoning_tokens=self.cfg.budget.reasoning_budget_for(task.task_type),
        )

    def assign(self, groups: list[tuple[str, str, Task]], iteration: int) -> Work:
        """Open each group on replica (group index mod replicas): its K episodes' work per replica."""
        work: Work = [([], []) for _ in range(len(self.rollouts))]
        for index, (group_id, name, task) in enumerate(groups):
            replica = index % len(self.rollouts)
            self.state.book.open(group_id)
            self.state.group_replica[group_id] = replica
            for k in range(self.cfg.rollout.samples_per_prompt):
                work[replica][0].append((name, task))
                work[replica][1].append(self.episode_options(group_id, k, task, iteration))
        return work

    def roll_out(self, iteration: int) -> list[Any]:
        """New groups queued, then one iteration on every replica: the finished episodes."""
        self.recover(self.rollouts.dead_replicas())  # before new episodes go to them
        groups = self.prompts.new_groups(iteration)
        self.ledger["drawn"] = [f"{group_id}:{task.id}" for group_id, _, task in groups]
        self.recover(self.rollouts.start_episodes(self.assign(groups, iteration)))
        episodes, dead = self.rollouts.run_iteration(iteration)
        self.recover(dead)
        return episodes

    def recover(self, dead: Iterable[int]) -> None:
        """Each dead replica: drop the open groups it held, restart it, re-sync it with the current weights."""
        for replica in sorted(dead):
            lost = self.state.drop_replica(replica)
            log.warning("rollout replica %d died: restarting it (%d open groups dropped)", replica, len(lost))
            self.rollouts.restart(replica)
            if self.state.step > 0:  # the new engine was built from the run's starting weights
                self.trainers.offload(False)
                self.trainers.push_to(self.rollouts, self.state.step)
                self.trainers.offload(True)

    # ------------------------------------------------------------------ 3-4: rewards and groups

    def score(self, episodes: list[Any]) -> tuple[list[rb.Sample], dict[str, float]]:
        """Rewards as samples for the group book: per episode in the isolated workers, or per complete group
        (group-scored envs: the critic, judged on the replica that ran them); plus the critic's metrics."""
        direct = [e for e in episodes if not self.envs[e.env_name].group_scored]
        samples = [to_sample(e, r) for e, r in zip(direct, self.rewards(direct))]
        complete = self.state.pending.add([e for e in episodes if self.envs[e.env_name].group_scored])
        if not complete:
            return samples, {}
        group_ids, calls = judge_calls(complete, lambda g: self.state.group_replica.get(g, 0))
        results, dead = self.rollouts.score_groups(calls)
        rewards, metrics = judged_rewards(group_ids, results)
        self.recover(dead)
        samples += [to_sample(e, r) for g, group_rewards in rewards.items() for e, r in zip(complete[g], group_rewards)]
        return samples, metrics

    def speak_up(self, samples: list[rb.Sample], iteration: int) -> None:
        """Log the first reward error texts of each env; stop the run (one line) when their share passes
        reward.max_reward_error_fraction."""
        names, errors = [s.env_name for s in samples], [s.reward_error for s in samples]
        for line in describe_errors(names, errors):
            log.warning("iteration %d reward errors: %s", iteration + 1, line)
        where, field = f"iteration {iteration + 1}", "reward.max_reward_error_fraction"
        check_error_fraction(names, errors, self.cfg.reward.max_reward_error_fraction, where, field)

    def rewards(self, episodes: list[Any]) -> list[Any]:
        """One Reward per episode, computed in the RewardPool's worker processes."""
        items = score_items(episodes, self.envs, self.cfg.env_configs())
        return self.reward_pool.score_batch(items) if items else []

    def file_samples(self, samples: list[rb.Sample]) -> int:
        """Add samples to the book; completed groups update their env's prompt sampler and feed the critic's
        closed loop (verifier-labelled pairs for critic_calibration)."""
        before = len(self.state.book.ready)
        completed = self.state.book.add(samples)
        for group in self.state.book.ready[before:]:
            first, kept = group[0], rb.scored(group)
            self.state.group_replica.pop(first.group_id, None)
            if kept:
                self.prompts.group_done(
                    first.env_name, first.task_id, [s.response_text for s in kept], [s.reward for s in kept]
                )
        self.infra_dropped += self.state.book.discard(rb.trainable)
        return completed

    def _drop_uniform(self, iteration: int) -> dict[str, Any]:
        """loss.drop_uniform_groups: forget ready groups whose shaped rewards are all equal. Returns the signal
        diagnostics of the ready groups before the drop (the trained ones would all read 1.0) and the count dropped."""
        ready = self.state.book.ready
        shaped = [self._shaped(g, iteration) for g in ready]
        row = group_diagnostics(shaped, [g[0].env_name for g in ready])
        keep = {id(g) for g, rewards in zip(ready, shaped) if group_has_signal(rewards)}
        row["train/dropped_uniform_groups"] = self.state.book.discard(lambda g: id(g) in keep)
        return row

    # ------------------------------------------------------------------ 5-6: train and push

    def _shaped(self, group: list[rb.Sample], iteration: int) -> list[float]:
        return rb.shaped_rewards(
            rb.scored(group), self.cfg.budget, self.cfg.length_penalty, iteration, self.cfg.reward.success_threshold
        )

    def _step_batch(
        self, groups: list[list[rb.Sample]], iteration: int
    ) -> tuple[list[list[rb.TrainSequence]], list[list[float]]]:
        """(per-rank shards of sequences with advantages, shaped rewards per group) of one optimizer step."""
        shaped = [self._shaped(g, iteration) for g in groups]
        shards = rb.shard_for_ranks(rb.step_sequences(groups, shaped), self.cfg.trainer.world_size)
        return [rb.by_length(shard) for shard in shards], shaped

    def train(self, iteration: int, timer: PhaseTimer) -> list[dict[str, Any]]:
        """As many optimizer steps as complete groups allow (up to max_steps_per_iteration); a row per step.

        pi_old (K1.5's reference) is the policy at the start of the iteration: every step's log-ratio is
        measured against it, so later steps of an iteration are braked by the tau term."""
        loss = self.cfg.loss
        steps = min(loss.max_steps_per_iteration, len(self.state.book.ready) // loss.groups_per_step)
        if steps == 0:
            return []
        with timer("sleep"):
            self.rollouts.sleep(True)
            self.trainers.offload(False)
        taken = [self.state.book.take(loss.groups_per_step) for _ in range(steps)]
        self.ledger["trained"] = [group[0].group_id for groups in taken for group in groups]
        batches = [self._step_batch(groups, iteration) for groups in taken]
        # learning signal of every group trained this iteration (same in each step's row: survives the step mean);
        # with the drop it was measured before it (iteration())
        signal = (
            {}
            if loss.drop_uniform_groups
            else group_diagnostics(
                [r for _, shaped in batches for r in shaped], [g[0].env_name for groups in taken for g in groups]
            )
        )
        with timer("logprobs"):
            olds, checks = self._old_policy(batches)
        rows = []
        for (shards, shaped), old in zip(batches, olds):
            micro = [rb.micro_batches(s, loss.micro_batch_size) for s in shards]
            old_micro = [rb.micro_batches(o, loss.micro_batch_size, like=s) for s, o in zip(shards, old)]
            with timer("train"):
                results = self.trainers.train_step(micro, old_micro, self.state.step)
            self.state.step += 1
            shaped_mean = sum(map(sum, shaped)) / sum(map(len, shaped))
            sizes = [(len(row.token_ids), head_positions(row.loss_mask)) for shard in shards for row in shard]
            step_s, world = results[0].get("time/trainer_step_s"), self.cfg.trainer.world_size
            perf = train_perf(self.perf, sizes, step_s, world)
            rows.append({**results[0], **checks, **signal, **perf, "train/shaped_reward_mean": shaped_mean})
        with timer("wake"):
            self.rollouts.sleep(False)
        return rows

    def _old_policy(
        self, batches: list[tuple[list[list[rb.TrainSequence]], Any]]
    ) -> tuple[list[Any], dict[str, float]]:
        """pi_old of every step's rows (the weights at the start of the iteration, the version the engines held),
        the IS weights and mask set on the rows, and the iteration's consistency and routing figures."""
        results = [self.trainers.old_policy(shards) for shards, _ in batches]  # [step][rank]
        correction = self.cfg.loss.is_correction
        olds, keeps = zip(*(apply_is_correction(shards, res, correction) for (shards, _), res in zip(batches, results)))
        rows = [row for shards, _ in batches for shard in shards for row in shard]
        tokens = [t for res in results for rank in res for t in rank["token_logprobs"]]
        cap = correction.cap if correction.enabled else None
        checks = step_consistency(rows, tokens, self.state.step, [k for ks in keeps for k in ks], cap)
        warn_masked(checks, correction)
        return list(olds), {**checks, **routing_metrics([rank for res in results for rank in res])}

    def train_and_push(self, iteration: int, timer: PhaseTimer) -> dict[str, Any]:
        """Steps 5-6: the optimizer steps, then the new weights to every replica; the steps' mean row."""
        train_rows = self.train(iteration, timer)
        row: dict[str, Any] = {"train/steps": len(train_rows), "train/step_total": self.state.step}
        if train_rows:
            with timer("push"):
                row.update(self.trainers.push_to(self.rollouts, self.state.step))
            with timer("offload"):
                self.trainers.offload(True)
            row.update(step_mean(train_rows))
        return row

    # ------------------------------------------------------------------ eval, memory, checkpoints

    def evaluate(self, where: str) -> dict[str, float]:
        """Greedy held-out accuracy per environment (`train.eval_split` tasks: dev by default), apart from training;
        stops early (one line) when scorer errors pile up (`score_in_chunks`)."""
        work = eval_work(self.prompts.heldout, self.cfg.budget, 0.0, 1, self.cfg.seed)
        episodes = self.rollouts.run_episodes(spread(work, len(self.rollouts)))
        items = score_items(episodes, self.envs, self.cfg.env_configs())
        names, limit = [e.env_name for e in episodes], self.cfg.reward.max_reward_error_fraction
        rewards = score_in_chunks(self.reward_pool.score_batch, items, names, self.cfg.train.eval_chunk, limit, where)
        per_env = summarize(episodes, rewards, self.cfg.reward.success_threshold)
        keys = ("accuracy", "truncation_rate", "baseline_best")  # baseline_best: judging envs only (critic_calibration)
        out = {f"eval/{name}/{key}": per_env[name][key] for name in per_env for key in keys if key in per_env[name]}
        out["eval/mean_accuracy"] = mean_accuracy(per_env)
        return out

    def memory(self) -> dict[str, float]:
        """Colocated memory: trainer + rollout actors' RSS now and their peaks (MiB)."""
        trainer, rollout = self.trainers.memory(), self.rollouts.memory()
        return {
            "memory/colocated_rss_mib": sum(m["rss_mib"] for m in trainer + rollout),
            "memory/colocated_peak_mib": sum(m["peak_rss_mib"] for m in trainer + rollout),
            "memory/trainer_peak_mib": max(m["peak_rss_mib"] for m in trainer),
            "memory/rollout_peak_mib": max(m["peak_rss_mib"] for m in rollout),
        }

    def save(self, iteration: int) -> Path:
        """checkpoints/iter-N (see `ControllerState.save`), with the trainers' weights on their device."""
        self.state.samplers, self.state.added_tasks = self.prompts.state_dict()
        self.trainers.offload(False)
        path = self.state.save(self.run_dir, iteration, self.trainers, self.rollouts, self.cfg.checkpoint.keep)
        self.trainers.offload(True)
        return path

    def resume_from(self, checkpoint: Path) -> None:
        """The controller state, the trainers' engine state, the paused episodes and the prompt samplers."""
        self.state = ControllerState.load(checkpoint, self.trainers, self.rollouts)
        self.rollouts.set_version(self.state.step)  # the engines were built from the checkpoint's weights
        self.prompts.load_state_dict(self.state.samplers, self.state.added_tasks)
        self.log.truncate_after(self.state.iteration)
        log.info("rl: resuming from %s (iteration %d)", checkpoint, self.state.iteration)

    # ------------------------------------------------------------------ the loop

    def rollout_metrics(self, samples: list[rb.Sample]) -> dict[str, float]:
        if not samples:
            return {"rollout/finished": 0}
        n, kept = len(samples), rb.scored(samples)
        row = {
            "rollout/finished": n,
            "reward/mean": sum(s.reward for s in kept) / max(len(kept), 1),
            "reward/infra_failures": n - len(kept),
            "reward/infra_dropped_groups": self.infra_dropped,
            "rollout/response_tokens_mean": sum(s.response_tokens for s in samples) / n,
            "rollout/truncation_rate": sum(s.truncated for s in samples) / n,
            "rollout/reasoning_tokens_mean": sum(s.reasoning_tokens for s in samples) / n,
            "rollout/reasoning_budget_rate": sum(s.finish_reason == "reasoning_budget" for s in samples) / n,
            "rollout/reward_errors": sum(s.reward_error is not None for s in samples),
        }
        for name in self.envs:
            mine = [s.reward for s in kept if s.env_name == name]
            if mine:
                row[f"reward/{name}"] = sum(mine) / len(mine)
        return row | agentic_metrics(samples, self.cfg.reward.success_threshold)

    def iteration(self, iteration: int) -> dict[str, Any]:
        """One full iteration (steps 1-7); returns its metrics row."""
        timer, row = PhaseTimer(), {"iteration": iteration + 1}
        self.ledger = {"drawn": [], "finished": [], "trained": []}
        self.infra_dropped = 0
        with timer("rollout"):
            episodes = self.roll_out(iteration)
        with timer("reward"):
            samples, critic_metrics = self.score(episodes)
            self.speak_up(samples, iteration)
            row["rollout/groups_completed"] = self.file_samples(samples)
        row.update(critic_metrics | self.prompts.metrics() | self.rollout_metrics(samples))
        row.update(rollout_perf(episodes, timer.seconds["rollout"]))
        if self.cfg.loss.drop_uniform_groups:
            row.update(self._drop_uniform(iteration))
        row.update(self.train_and_push(iteration, timer))
        row["rollout/paused_groups"] = len(self.state.book.open_groups)
        self.ledger["finished"] = [f"{sample.group_id}/{sample.index}" for sample in samples]
        self.ledger["paused"] = list(self.state.book.open_groups)
        self.ledger["pool"] = [f"{name}:{task.id}" for name, tasks in self.prompts.added.items() for task in tasks]
        row.update(ledger_row(self.ledger))
        row["rollout/actor_restarts"] = self.rollouts.restarts
        if self._due(iteration + 1, self.cfg.train.eval_every):
            with timer("eval"):
                row.update(self.evaluate(f"eval after iteration {iteration + 1}"))
        row.update({f"time/{name}_s": round(s, 4) for name, s in timer.seconds.items()})
        return row | self.memory()

    def _due(self, iteration: int, every: int) -> bool:
        return iteration == self.cfg.train.iterations or (every > 0 and iteration % every == 0)

    def loop(self) -> int:
        """Iterations from the resumed point to the end (or stop_at_iteration); returns the last done."""
        from tqdm import tqdm

        train = self.cfg.train
        end = min(train.iterations, train.stop_at_iteration or train.iterations)
        if self.state.iteration == 0 and train.eval_at_start:
            self.log.append({"iteration": 0, **self.evaluate("pre-RL eval")})
        first, started = self.state.iteration, time.perf_counter()
        bar = tqdm(range(first, end), desc="rl", unit="it", disable=None, initial=first, total=end)
        for iteration in bar:
            row = self.iteration(iteration)
            self.state.iteration = iteration + 1
            self.log.append(row)
            bar.set_postfix(reward=f"{row.get('reward/mean', float('nan')):.3f}", steps=self.state.step)
            if bar.disable and (iteration + 1 == end or (iteration + 1) % train.log_every == 0):
                seconds_per_it = (time.perf_counter() - started) / (iteration + 1 - first)
                print(progress_line(row, iteration + 1, end, seconds_per_it), flush=True)
            if iteration + 1 == end or self._due(iteration + 1, self.cfg.checkpoint.every):
                self.save(iteration + 1)
        return end

    def finish(self, end: int, wall_s: float) -> dict[str, Any]:
        """final/ (HF model), plots, summary.json."""
        final = publish_final(self.run_dir, end) if end >= self.cfg.train.iterations else None
        rows = read_metrics(self.run_dir / "metrics.jsonl")
        plots = write_plots(self.run_dir / "metrics.jsonl", self.run_dir / "plots") if self.cfg.train.plots else []
        summary = {
            **summary_of(rows),
            "completed": final is not None,
            "final_dir": str(final) if final else None,
            "optimizer_steps": self.state.step,
            "actor_restarts": self.rollouts.restarts,
            "wall_s": round(wall_s, 2),
            "plots": [p.name for p in plots],
        }
        dump_json(self.run_dir / "summary.json", summary)
        return summary

    def close(self) -> None:
        """Stop the actors and the reward workers (Ray itself is left to whoever started it)."""
        self.cluster.close(self.trainers, self.rollouts)
        if self.reward_pool is not None:
            self.reward_pool.close()
        if self.log is not None:
            self.log.close()

    def run(self) -> dict[str, Any]:
        """setup -> loop -> finish; actors are stopped whatever happens."""
        started = time.perf_counter()
        try:
            self.setup()
            end = self.loop()
            return self.finish(end, time.perf_counter() - started)
        finally:
            self.close()
