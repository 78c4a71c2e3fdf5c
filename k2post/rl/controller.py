"""The RL controller: one process driving trainer ranks and rollout actors on Ray, iteration by iteration.

    run = RLRun(load_run_config("configs/rl_demo.yaml", expected_kind="rl"))
    summary = run.run()           # setup, resume, iterations, final model, plots, summary.json

Per iteration (docs/RL.md):
  1. draw prompts from the environment mix (prioritized / curriculum sampling per environment);
  2. start K episodes per prompt on the rollout actors (per-task-type temperature and token
     budget, per-episode seeds) and step every queued or paused episode one iteration (partial
     rollout: unfinished ones stay paused in their actor);
  3. score finished episodes in the RewardPool's isolated worker processes;
  4. complete groups of K -> shaped rewards (budget penalty, length reward) -> advantages;
  5. engines sleep; trainer ranks compute pi_old log-probs and take MuonClip steps on K1.5 + PTX;
  6. engines wake; every trainer rank pushes the weights to its rollout actor (checkpoint engine);
  7. metrics (time and memory per phase), held-out eval, checkpoint.
A dead rollout actor is replaced, re-synced with the current weights, and its lost groups dropped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import shutil
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from k2post.config.loader import dump_yaml
from k2post.envs.base import Task
from k2post.evaluation.heldout import draw_tasks, eval_work, final_text, mean_accuracy, score_items, summarize
from k2post.rl import batch as rb
from k2post.rl.critic_loop import CalibrationHarvester, PendingGroups, group_of, score_on_actors
from k2post.rl.diagnostics import agentic_metrics, group_diagnostics, group_has_signal
from k2post.rollout.agentic import EpisodeOptions, episode_tool_stats
from k2post.rl.metrics import RunLog, dump_json, read_metrics, summary_of, write_plots
from k2post.rl.run_config import RLConfig
from k2post.train import checkpoint as checkpoints
from k2post.rl.sampling import PromptSampler
from k2post.rl.schedules import temperature_for

log = logging.getLogger(__name__)
CHECKPOINTS, STATE_FILE, ITERATION_PREFIX = checkpoints.CHECKPOINTS_DIR, "controller.pkl", "iter"


class RLRunDirError(ValueError):
    """run_dir holds an earlier run and resume is off."""


@dataclass
class ControllerState:
    """What a checkpoint needs besides the trainer's engine state (pickled)."""

    iteration: int = 0  # iterations completed
    step: int = 0  # optimizer steps taken
    samplers: dict[str, dict[str, Any]] = field(default_factory=dict)
    book: rb.GroupBook | None = None
    paused: list[list[Any]] = field(default_factory=list)  # per rollout replica
    group_replica: dict[str, int] = field(default_factory=dict)  # open group -> replica that holds it
    pending: PendingGroups | None = None  # finished episodes of group-scored envs waiting for their group
    added_tasks: dict[str, list[Task]] = field(default_factory=dict)  # tasks added to pools during the run


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


def allocate(counts_total: int, weights: dict[str, float], iteration: int, seed: int) -> dict[str, int]:
    """Split `counts_total` prompts over environments by weight (largest remainder, ties by a seeded order)."""
    total = sum(weights.values())
    exact = {name: counts_total * w / total for name, w in weights.items()}
    counts = {name: int(v) for name, v in exact.items()}
    order = sorted(exact, key=lambda n: (-(exact[n] - counts[n]), zlib.crc32(f"{seed}:{iteration}:{n}".encode())))
    for name in order[: counts_total - sum(counts.values())]:
        counts[name] += 1
    return counts


def engine_gap(rows: list[rb.TrainSequence], trainer_logprobs: list[float]) -> dict[str, float]:
    """How far the rollout engine's log pi(y|x) is from the trainer's pi_old, per sequence (0 when in sync;
    only rows written by one policy version in the last iteration compare like with like)."""
    pairs = [(r.rollout_logprob, t) for r, t in zip(rows, trainer_logprobs) if r.rollout_logprob is not None]
    if not pairs:
        return {}
    gaps = [abs(a - b) for a, b in pairs]
    return {"train/engine_logprob_gap_mean": sum(gaps) / len(gaps), "train/engine_logprob_gap_max": max(gaps)}


def progress_line(row: dict[str, Any], done: int, end: int, seconds_per_it: float) -> str:
    """One line per logged iteration when no progress bar is shown (logs, `ray job` output)."""
    evals = f" eval {row['eval/mean_accuracy']:.3f}" if "eval/mean_accuracy" in row else ""
    return (
        f"rl: iteration {done}/{end} reward {row.get('reward/mean', float('nan')):.3f} "
        f"steps {row.get('train/step_total', 0)}"
        f"{evals} ({seconds_per_it:.1f} s/it, eta {seconds_per_it * (end - done) / 60:.1f} min)"
    )


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete iter-N checkpoint (it has controller.pkl), or None."""
    return checkpoints.latest_checkpoint(run_dir, ITERATION_PREFIX, (STATE_FILE,))


class RLRun:
    """One RL run: owns the Ray actors, the task pools, the group book and the run dir."""

    def __init__(self, cfg: RLConfig) -> None:
        self.cfg = cfg
        self.run_dir = Path(cfg.run_dir)
        self.state = ControllerState(
            book=rb.GroupBook(cfg.rollout.samples_per_prompt), pending=PendingGroups(cfg.rollout.samples_per_prompt)
        )
        self.trainers: list[Any] = []
        self.rollouts: list[Any] = []
        self.pool = self.reward_pool = self.log = self.placement = None
        self.restarts = 0
        self.model_dir: Path | None = None

    # ------------------------------------------------------------------ setup

    def prepare_run_dir(self) -> Path | None:
        """Refuse an earlier run unless resuming; write config.yaml; returns the checkpoint to resume from."""
        earlier = (self.run_dir / "metrics.jsonl").exists() or latest_checkpoint(self.run_dir) is not None
        if earlier and not self.cfg.resume:
            raise RLRunDirError(
                f"run_dir {self.cfg.run_dir!r} already holds a run: set resume: true (or --resume) to continue it, "
                "or pick another run_dir"
            )
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(dump_yaml(self.cfg))
        return latest_checkpoint(self.run_dir) if self.cfg.resume else None

    def build_tasks(self) -> None:
        """Train pools and held-out (test split, other seed) tasks per environment; one sampler per env."""
        train = self.cfg.train
        self.envs = {entry.name: entry.make() for entry in self.cfg.envs}
        self.pools: dict[str, dict[str, Task]] = {}
        self.heldout: dict[str, list[Task]] = {}
        self.samplers: dict[str, PromptSampler] = {}
        for name, env in self.envs.items():
            tasks = list(env.tasks("train", seed=self.cfg.seed, n=train.prompt_pool_per_env))
            if not tasks and not (name == "critic_calibration" and self.cfg.critic.harvest_pairs_per_group > 0):
                raise ValueError(f"environment {name!r} gave no train tasks")  # critic_calibration may fill up online
            self.pools[name] = {task.id: task for task in tasks}
            self.heldout[name] = draw_tasks(env, train.eval_split, train.eval_tasks_per_env, self.cfg.seed)
            difficulty = {t.id: float(t.metadata.get("difficulty", 0)) for t in tasks}
            self.samplers[name] = PromptSampler(
                list(self.pools[name]), self.cfg.prompt_sampling, difficulty, seed=self.cfg.seed
            )
        self.harvester = None
        if "critic_calibration" in self.envs and self.cfg.critic.harvest_pairs_per_group > 0:
            self.harvester = CalibrationHarvester(
                "critic_calibration",
                self.envs["critic_calibration"],
                self.cfg.reward.success_threshold,
                self.cfg.critic.harvest_pairs_per_group,
                self.cfg.critic.max_harvested_tasks,
                self.cfg.seed,
            )

    def add_tasks(self, env_name: str, tasks: list[Task]) -> int:
        """Grow an environment's train pool during the run (kept in the controller state for resume)."""
        fresh = [t for t in tasks if t.id not in self.pools[env_name]]
        for task in fresh:
            self.pools[env_name][task.id] = task
        self.samplers[env_name].add([t.id for t in fresh])
        self.state.added_tasks.setdefault(env_name, []).extend(fresh)
        return len(fresh)

    def start_ray(self) -> None:
        import ray

        if ray.is_initialized():
            return
        ray_cfg = self.cfg.ray
        if ray_cfg.address or os.environ.get("RAY_ADDRESS"):
            ray.init(address=ray_cfg.address, log_to_driver=True)
        else:
            ray.init(num_cpus=ray_cfg.num_cpus, _temp_dir=ray_cfg.temp_dir, include_dashboard=False, log_to_driver=True)

    def place(self) -> None:
        """One placement-group bundle per trainer rank; rollout replica r shares bundle r (colocated)."""
        import ray
        from ray.util.placement_group import placement_group

        bundles = [{"CPU": self.cfg.ray.cpus_per_bundle}] * self.cfg.trainer.world_size
        self.placement = placement_group(bundles, strategy="PACK")
        ray.get(self.placement.ready(), timeout=120)

    def _options(self, bundle: int) -> dict[str, Any]:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = PlacementGroupSchedulingStrategy(placement_group=self.placement, placement_group_bundle_index=bundle)
        return {"num_cpus": self.cfg.ray.cpus_per_bundle / 2, "scheduling_strategy": strategy}

    def start_trainers(self) -> None:
        import ray

        from k2post.rl.trainer import RLTrainerWorker
        from k2post.train.distributed import free_port

        port, actor_cls = free_port(), ray.remote(RLTrainerWorker)
        self.trainers = [
            actor_cls.options(**self._options(r)).remote(self.cfg, str(self.model_dir), r, port)
            for r in range(self.cfg.trainer.world_size)
        ]
        self.trainer_facts = ray.get([t.ready.remote() for t in self.trainers])

    def _start_rollout(self, replica: int) -> Any:
        from k2post.rollout.actor import make_rollout_actor
        from k2post.rollout.config import SamplingConfig

        rollout = self.cfg.rollout
        # the runner's defaults: every RL episode's EpisodeOptions set its temperature (the decay schedule at its
        # iteration), seed and budget
        sampling = SamplingConfig(
            temperature=self.cfg.temperature.default.start,
            top_p=rollout.top_p,
            max_tokens=rollout.agentic.max_turn_tokens,
            logprobs=True,
        )
        engine = rollout.engine.model_copy(update={"seed": self.cfg.seed})
        return make_rollout_actor(
            self.model_dir,
            engine,
            self.cfg.env_configs(),
            rollout.agentic,
            sampling,
            max_restarts=0,
            **self._options(replica),
        )

    def start_rollouts(self) -> None:
        import ray

        self.rollouts = [self._start_rollout(r) for r in range(self.cfg.rollout.replicas)]
        ray.get([a.ready.remote() for a in self.rollouts])

    def setup(self) -> None:
        """Everything up to the first iteration (resuming when configured)."""
        from k2post.envs.workers import RewardPool
        from k2post.models.loading import ensure_model

        checkpoint = self.prepare_run_dir()
        self.build_tasks()
        self.model_dir = checkpoint or ensure_model(self.cfg.model)
        self.reward_pool = RewardPool(num_workers=self.cfg.reward.workers, timeout_s=self.cfg.reward.timeout_s)
        self.start_ray()
        self.place()
        self.start_trainers()
        self.start_rollouts()
        self.log = RunLog(self.run_dir)
        if checkpoint is not None:
            self.resume_from(checkpoint)
        else:
            self.log.truncate_after(-1)
        self._offload_trainers(True)  # the engines generate first

    # ------------------------------------------------------------------ 1-2: prompts and rollouts

    def new_groups(self, iteration: int) -> list[tuple[str, str, Task]]:
        """(group_id, env_name, task) of this iteration's prompts."""
        weights = {entry.name: entry.weight for entry in self.cfg.envs}
        counts = allocate(self.cfg.rollout.prompts_per_iteration, weights, iteration, self.cfg.seed)
        groups = []
        for name, count in counts.items():
            count = min(count, len(self.pools[name]))  # a pool that fills up during the run (critic_calibration)
            for j, task_id in enumerate(self.samplers[name].sample(count, iteration) if count else []):
                groups.append((f"i{iteration}-{name}-{j}", name, self.pools[name][task_id]))
        return groups

    def _episode_options(self, group_id: str, k: int, task: Task, iteration: int) -> EpisodeOptions:
        key = f"{group_id}/{k}"
        return EpisodeOptions(
            id=key,
            seed=episode_seed(self.cfg.seed, key),
            temperature=temperature_for(self.cfg.temperature, task.task_type, iteration),
            max_tokens=self.cfg.budget.budget_for(task.task_type),
        )

    def start_groups(self, groups: list[tuple[str, str, Task]], iteration: int) -> None:
        """Open each group and queue its K episodes on replica (group index mod replicas)."""
        import ray

        per_replica: list[tuple[list, list]] = [([], []) for _ in self.rollouts]
        for index, (group_id, name, task) in enumerate(groups):
            replica = index % len(self.rollouts)
            self.state.book.open(group_id)
            self.state.group_replica[group_id] = replica
            for k in range(self.cfg.rollout.samples_per_prompt):
                per_replica[replica][0].append((name, task))
                per_replica[replica][1].append(self._episode_options(group_id, k, task, iteration))
        ray.get([a.start_episodes.remote(items, opts) for a, (items, opts) in zip(self.rollouts, per_replica) if items])

    def check_rollouts(self, timeout_s: float = 60.0) -> None:
        """Ping every rollout actor; replace the dead ones (before new episodes go to them)."""
        import ray

        for replica, actor in enumerate(list(self.rollouts)):
            try:
                ray.get(actor.ping.remote(), timeout=timeout_s)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as err:
                log.warning("rollout replica %d is gone (%s): restarting it", replica, type(err).__name__)
                self.replace_rollout(replica)

    def roll_out(self, iteration: int) -> list[Any]:
        """One iteration on every replica; a dead replica is replaced and its groups dropped."""
        import ray

        refs = [a.run_iteration.remote(iteration, False) for a in self.rollouts]
        finished = []
        for replica, ref in enumerate(refs):
            try:
                finished.extend(ray.get(ref))
            except ray.exceptions.RayActorError as err:
                log.warning("rollout replica %d died (%s): restarting it", replica, type(err).__name__)
                self.replace_rollout(replica)
        return finished

    def replace_rollout(self, replica: int) -> None:
        """Start a new actor for `replica`, drop the groups it held, re-sync the weights to everyone."""
        import ray

        self.restarts += 1
        if self.restarts > self.cfg.ray.actor_restarts:
            raise RuntimeError(
                f"rollout actors died {self.restarts} times (ray.actor_restarts={self.cfg.ray.actor_restarts}): "
                "giving up"
            )
        lost = [g for g, r in self.state.group_replica.items() if r == replica]
        self.state.book.drop(lost)
        self.state.pending.drop(lost)
        for group_id in lost:
            del self.state.group_replica[group_id]
        self.rollouts[replica] = self._start_rollout(replica)
        ray.get(self.rollouts[replica].ready.remote())
        if self.state.step > 0:  # the new engine was built from the run's starting weights
            self._offload_trainers(False)
            self.push()
            self._offload_trainers(True)

    # ------------------------------------------------------------------ 3-4: rewards and groups

    def score(self, episodes: list[Any]) -> tuple[list[rb.Sample], dict[str, float]]:
        """Rewards as samples for the group book: per episode in the isolated workers, or per complete group
        (group-scored envs: the critic, judged on the actor that ran them); plus the critic's metrics."""
        direct = [e for e in episodes if not self.envs[e.env_name].group_scored]
        samples = [self._sample(e, r) for e, r in zip(direct, self.rewards(direct))]
        complete = self.state.pending.add([e for e in episodes if self.envs[e.env_name].group_scored])
        if not complete:
            return samples, {}
        rewards, metrics, dead = score_on_actors(complete, self.rollouts, lambda g: self.state.group_replica.get(g, 0))
        for replica in sorted(dead):
            self.replace_rollout(replica)
        samples += [
            self._sample(e, r) for g, group_rewards in rewards.items() for e, r in zip(complete[g], group_rewards)
        ]
        return samples, metrics

    def rewards(self, episodes: list[Any]) -> list[Any]:
        """One Reward per episode, computed in the RewardPool's worker processes."""
        items = score_items(episodes, self.envs, self.cfg.env_configs())
        return self.reward_pool.score_batch(items) if items else []

    @staticmethod
    def _sample(episode: Any, reward: Any) -> rb.Sample:
        group_id, index = group_of(episode.id)
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
            [v for v in episode.versions if v >= 0],
            reward.error,
            sum(lp for lp, m in zip(episode.logprobs, episode.loss_mask) if m),
            final_text(episode),
            **episode_tool_stats(episode),
        )

    def file_samples(self, samples: list[rb.Sample]) -> int:
        """Add samples to the book; completed groups update their env's prompt sampler and feed the critic's
        closed loop (verifier-labelled pairs for critic_calibration)."""
        before = len(self.state.book.ready)
        completed = self.state.book.add(samples)
        threshold = self.cfg.reward.success_threshold
        for group in self.state.book.ready[before:]:
            self.state.group_replica.pop(group[0].group_id, None)
            success = sum(s.reward >= threshold for s in group) / len(group)
            self.samplers[group[0].env_name].update({group[0].task_id: success})
            if self.harvester is not None:
                task = self.pools[group[0].env_name][group[0].task_id]
                new = self.harvester.harvest(
                    group[0].env_name, task, [s.response_text for s in group], [s.reward for s in group]
                )
                self.add_tasks("critic_calibration", new)
        return completed

    # ------------------------------------------------------------------ 5-6: train and push

    def _sleep_rollouts(self, asleep: bool) -> None:
        import ray

        if self.cfg.rollout.sleep_during_training:
            ray.get([(a.sleep.remote() if asleep else a.wake_up.remote()) for a in self.rollouts])

    def train(self, iteration: int, timer: PhaseTimer) -> list[dict[str, Any]]:
        """As many optimizer steps as complete groups allow (up to max_steps_per_iteration).

        pi_old (K1.5's reference) is the policy at the start of the iteration: every step's log-ratio is
        measured against it, so later steps of an iteration are braked by the tau term."""
        import ray

        loss = self.cfg.loss
        steps = min(loss.max_steps_per_iteration, len(self.state.book.ready) // loss.groups_per_step)
        rows: list[dict[str, Any]] = []
        if steps == 0:
            return rows
        with timer("sleep"):
            self._sleep_rollouts(True)
            self._offload_trainers(False)
        taken = [self.state.book.take(loss.groups_per_step) for _ in range(steps)]
        batches = [self._step_batch(groups, iteration) for groups in taken]
        # learning signal of every group trained this iteration (same in each step's row: survives the step average)
        signal = (
            {}
            if loss.drop_uniform_groups
            else group_diagnostics(  # with the drop: measured before it (iteration())
                [r for _, shaped in batches for r in shaped], [g[0].env_name for groups in taken for g in groups]
            )
        )
        with timer("logprobs"):  # pi_old: the weights at the start of the iteration, for every step's data
            olds = [
                ray.get([t.sequence_logprobs.remote(s) for t, s in zip(self.trainers, shards)]) for shards, _ in batches
            ]
        gap = engine_gap(
            [s for shards, _ in batches for shard in shards for s in shard], [v for old in olds for o in old for v in o]
        )
        for (shards, shaped), old in zip(batches, olds):
            micro = [rb.micro_batches(s, loss.micro_batch_size) for s in shards]
            old_micro = [rb.micro_batches(o, loss.micro_batch_size) for o in old]
            with timer("train"):
                results = ray.get(
                    [t.train_step.remote(m, o, self.state.step) for t, m, o in zip(self.trainers, micro, old_micro)]
                )
            self.state.step += 1
            rows.append(
                {
                    **results[0],
                    **gap,
                    **signal,
                    "train/shaped_reward_mean": sum(map(sum, shaped)) / sum(map(len, shaped)),
                }
            )
        with timer("wake"):
            self._sleep_rollouts(False)
        return rows

    def _drop_uniform(self, iteration: int) -> dict[str, Any]:
        """loss.drop_uniform_groups: forget ready groups whose shaped rewards are all equal. Returns the signal
        diagnostics of the ready groups before the drop (the trained ones would all read 1.0) and the count dropped."""
        ready = self.state.book.ready
        shaped = [self._shaped(g, iteration) for g in ready]
        row = group_diagnostics(shaped, [g[0].env_name for g in ready])
        keep = {id(g) for g, rewards in zip(ready, shaped) if group_has_signal(rewards)}
        row["train/dropped_uniform_groups"] = self.state.book.discard(lambda g: id(g) in keep)
        return row

    def _shaped(self, group: list[rb.Sample], iteration: int) -> list[float]:
        return rb.shaped_rewards(
            group, self.cfg.budget, self.cfg.length_penalty, iteration, self.cfg.reward.success_threshold
        )

    def _step_batch(
        self, groups: list[list[rb.Sample]], iteration: int
    ) -> tuple[list[list[rb.TrainSequence]], list[list[float]]]:
        """(per-rank shards of sequences with advantages, shaped rewards per group) of one optimizer step."""
        shaped = [self._shaped(g, iteration) for g in groups]
        shards = rb.shard_for_ranks(rb.step_sequences(groups, shaped), self.cfg.trainer.world_size)
        return [rb.by_length(shard) for shard in shards], shaped

    def _offload_trainers(self, offload: bool) -> None:
        """Trainer params and optimizer state to DRAM (rollout) or back (training); a no-op without a device."""
        import ray

        if self.cfg.trainer.offload_during_rollout:
            ray.get([(t.offload.remote() if offload else t.reload.remote()) for t in self.trainers])

    def push(self) -> dict[str, float]:
        """Every trainer rank streams the weights to its replica (checkpoint engine); timed."""
        import ray

        started = time.perf_counter()
        addresses = ray.get([t.open_push.remote() for t in self.trainers])
        receives = [a.receive_weights.remote(addresses[r], 300.0) for r, a in enumerate(self.rollouts)]
        pushes = [t.push_weights.remote() for t in self.trainers]
        ray.wait(receives + pushes, num_returns=len(receives + pushes), timeout=600)
        ray.get(receives)  # a receiver's error says more than the sender's "peer gone"
        stats = ray.get(pushes)
        return {"time/push_s": time.perf_counter() - started, "push/mb": stats[0]["nbytes"] / 2**20}

    # ------------------------------------------------------------------ eval, memory, checkpoints

    def evaluate(self) -> dict[str, float]:
        """Greedy held-out accuracy per environment (`train.eval_split` tasks: dev by default), apart from training."""
        import ray

        work = eval_work(self.heldout, self.cfg.budget, 0.0, 1, self.cfg.seed)
        parts: list[tuple[list, list]] = [([], []) for _ in self.rollouts]
        for position, (item, options) in enumerate(work):
            parts[position % len(self.rollouts)][0].append(item)
            parts[position % len(self.rollouts)][1].append(options)
        refs = [a.run_episodes.remote(items, opts) for a, (items, opts) in zip(self.rollouts, parts) if items]
        episodes = [e for part in ray.get(refs) for e in part]
        per_env = summarize(episodes, self.rewards(episodes), self.cfg.reward.success_threshold)
        out = {f"eval/{name}/{key}": per_env[name][key] for name in per_env for key in ("accuracy", "truncation_rate")}
        out["eval/mean_accuracy"] = mean_accuracy(per_env)
        return out

    def memory(self) -> dict[str, float]:
        """Colocated memory: trainer + rollout actors' RSS now and their peaks (MiB)."""
        import ray

        trainer = ray.get([t.memory.remote() for t in self.trainers])
        rollout = ray.get([a.memory.remote() for a in self.rollouts])
        return {
            "memory/colocated_rss_mib": sum(m["rss_mib"] for m in trainer + rollout),
            "memory/colocated_peak_mib": sum(m["peak_rss_mib"] for m in trainer + rollout),
            "memory/trainer_peak_mib": max(m["peak_rss_mib"] for m in trainer),
            "memory/rollout_peak_mib": max(m["peak_rss_mib"] for m in rollout),
        }

    def save(self, iteration: int) -> Path:
        """checkpoints/iter-N atomically: trainer engine state + HF model, paused episodes, controller state."""
        import ray

        target = self.run_dir / CHECKPOINTS / f"{ITERATION_PREFIX}-{iteration}"
        tmp = target.with_name(f".{target.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self._offload_trainers(False)
        ray.get([t.save.remote(str(tmp)) for t in self.trainers])
        self._offload_trainers(True)
        self.state.paused = ray.get([a.export_paused.remote() for a in self.rollouts])
        self.state.samplers = {name: s.state_dict() for name, s in self.samplers.items()}
        with open(tmp / STATE_FILE, "wb") as handle:
            pickle.dump(self.state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        checkpoints.publish(tmp, target)
        self._prune()
        return target

    def _prune(self) -> None:
        checkpoints.prune_checkpoints(self.run_dir, self.cfg.checkpoint.keep, ITERATION_PREFIX, (STATE_FILE,))

    def resume_from(self, checkpoint: Path) -> None:
        """Load the controller state, the trainer engine state and the paused episodes."""
        import ray

        with open(checkpoint / STATE_FILE, "rb") as handle:
            self.state = pickle.load(handle)  # our own file, written by save()
        for name, tasks in self.state.added_tasks.items():
            self.pools[name].update({task.id: task for task in tasks})
        if self.harvester is not None:
            self.harvester.restore(self.state.added_tasks.get("critic_calibration", []))
        for name, sampler in self.samplers.items():
            sampler.load_state_dict(self.state.samplers[name])
        ray.get([t.load.remote(str(checkpoint)) for t in self.trainers])
        ray.get([a.import_paused.remote(p) for a, p in zip(self.rollouts, self.state.paused)])
        self.log.truncate_after(self.state.iteration)
        log.info("resumed from %s at iteration %d", checkpoint, self.state.iteration)

    # ------------------------------------------------------------------ the loop

    def rollout_metrics(self, samples: list[rb.Sample]) -> dict[str, float]:
        if not samples:
            return {"rollout/finished": 0}
        n = len(samples)
        row = {
            "rollout/finished": n,
            "reward/mean": sum(s.reward for s in samples) / n,
            "rollout/response_tokens_mean": sum(s.response_tokens for s in samples) / n,
            "rollout/truncation_rate": sum(s.truncated for s in samples) / n,
            "rollout/reward_errors": sum(s.reward_error is not None for s in samples),
        }
        for name in self.envs:
            mine = [s.reward for s in samples if s.env_name == name]
            if mine:
                row[f"reward/{name}"] = sum(mine) / len(mine)
        return row | agentic_metrics(samples, self.cfg.reward.success_threshold)

    def iteration(self, iteration: int) -> dict[str, Any]:
        """One full iteration (steps 1-7); returns its metrics row."""
        timer, row = PhaseTimer(), {"iteration": iteration + 1}
        with timer("rollout"):
            self.check_rollouts()
            self.start_groups(self.new_groups(iteration), iteration)
            episodes = self.roll_out(iteration)
        with timer("reward"):
            samples, critic_metrics = self.score(episodes)
            row["rollout/groups_completed"] = self.file_samples(samples)
        row.update(critic_metrics)
        if self.harvester is not None:
            row.update(
                {
                    "calibration/harvested_tasks": self.harvester.added,
                    "calibration/pool": len(self.pools["critic_calibration"]),
                }
            )
        row.update(self.rollout_metrics(samples))
        if self.cfg.loss.drop_uniform_groups:
            row.update(self._drop_uniform(iteration))
        train_rows = self.train(iteration, timer)
        if train_rows:
            with timer("push"):
                row.update(self.push())
            with timer("offload"):
                self._offload_trainers(True)
            row.update(
                {
                    k: sum(r[k] for r in train_rows) / len(train_rows)
                    for k in train_rows[0]
                    if isinstance(train_rows[0][k], (int, float))
                }
            )
        row.update(
            {
                "train/steps": len(train_rows),
                "train/step_total": self.state.step,
                "rollout/paused_groups": len(self.state.book.open_groups),
                "rollout/actor_restarts": self.restarts,
            }
        )
        if self._due(iteration + 1, self.cfg.train.eval_every):
            with timer("eval"):
                row.update(self.evaluate())
        row.update({f"time/{name}_s": round(s, 4) for name, s in timer.seconds.items()})
        row.update(self.memory())
        return row

    def _due(self, iteration: int, every: int) -> bool:
        return iteration == self.cfg.train.iterations or (every > 0 and iteration % every == 0)

    def loop(self) -> int:
        """Iterations from the resumed point to the end (or stop_at_iteration); returns the last done."""
        from tqdm import tqdm

        train = self.cfg.train
        end = min(train.iterations, train.stop_at_iteration or train.iterations)
        if self.state.iteration == 0:
            self.log.append({"iteration": 0, **self.evaluate()})
        bar = tqdm(
            range(self.state.iteration, end),
            desc="rl",
            unit="it",
            disable=None,
            initial=self.state.iteration,
            total=end,
        )
        started, first = time.perf_counter(), self.state.iteration
        for iteration in bar:
            row = self.iteration(iteration)
            self.state.iteration = iteration + 1
            self.log.append(row)
            bar.set_postfix(reward=f"{row.get('reward/mean', float('nan')):.3f}", steps=self.state.step)
            if bar.disable and (iteration + 1 == end or (iteration + 1) % train.log_every == 0):
                print(
                    progress_line(row, iteration + 1, end, (time.perf_counter() - started) / (iteration + 1 - first)),
                    flush=True,
                )
            if iteration + 1 == end or self._due(iteration + 1, self.cfg.checkpoint.every):
                self.save(iteration + 1)
        return end

    def finish(self, end: int, wall_s: float) -> dict[str, Any]:
        """final/ (HF model), plots, summary.json."""
        final = None
        if end >= self.cfg.train.iterations:
            final = self.run_dir / "final"
            shutil.copytree(
                self.run_dir / CHECKPOINTS / f"{ITERATION_PREFIX}-{end}",
                final.with_name(".final.tmp"),
                dirs_exist_ok=True,
                ignore=shutil.ignore_patterns("engine", "rng", STATE_FILE),
            )
            checkpoints.publish(final.with_name(".final.tmp"), final)
        rows = read_metrics(self.run_dir / "metrics.jsonl")
        plots = write_plots(self.run_dir / "metrics.jsonl", self.run_dir / "plots") if self.cfg.train.plots else []
        summary = {
            **summary_of(rows),
            "completed": final is not None,
            "final_dir": str(final) if final else None,
            "optimizer_steps": self.state.step,
            "actor_restarts": self.restarts,
            "wall_s": round(wall_s, 2),
            "plots": [p.name for p in plots],
        }
        dump_json(self.run_dir / "summary.json", summary)
        return summary

    def close(self) -> None:
        """Stop the actors and the reward workers (Ray itself is left to whoever started it)."""
        import ray

        for actor in self.rollouts + self.trainers:
            with contextlib.suppress(Exception):
                ray.kill(actor)
        if self.placement is not None:
            with contextlib.suppress(Exception):
                ray.util.remove_placement_group(self.placement)
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
