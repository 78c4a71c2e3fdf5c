"""The RL run's Ray actors behind three facades: where they run, the trainer ranks, the rollout replicas.

Every `ray` call of the RL controller lives here; the controller (`k2post/rl/controller.py`) sees plain
Python methods, so its loop is unit-tested with in-process fakes (tests/k2post/rl/fakes.py).

    cluster = RayCluster(cfg)                          # joins or starts Ray, one placement bundle per rank
    trainers, rollouts = cluster.start(model_dir)      # both built at once on CPU (see `ray.start_together`)
    episodes, dead = rollouts.run_iteration(iteration) # dead: replicas that died during the call
    rollouts.restart(replica)                          # a fresh actor in the same bundle (counted, capped)
    trainers.push_to(rollouts)                         # checkpoint engine: rank r streams to replica r
    cluster.close(trainers, rollouts)

- `TrainerGroup`: `cfg.trainer.world_size` `RLTrainerWorker` ranks (DeepSpeed + MuonClip), one per bundle.
- `RolloutGroup`: `cfg.rollout.replicas` `RolloutWorker`s (vLLM + environments); replica r shares bundle r
  with trainer rank r (colocated). A dead replica is reported (`dead` sets, `dead_replicas()`), never hidden:
  the controller decides what the loss means (its open groups are dropped) and calls `restart`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from k2post.envs.registry import PLUGINS_ENV_VAR
from k2post.rl.run_config import RLConfig
from k2post.rollout.agentic import EpisodeOptions

log = logging.getLogger(__name__)
Work = list[tuple[list[tuple[str, Any]], list[EpisodeOptions]]]  # per replica: ((env_name, task) items, options)


class ActorRestartLimitError(RuntimeError):
    """Rollout actors died more often than `ray.actor_restarts` allows."""


def count_restart(restarts: int, limit: int) -> int:
    """One more restart of a dead rollout actor: the new count, or ActorRestartLimitError past `limit`."""
    if restarts + 1 > limit:
        raise ActorRestartLimitError(
            f"rollout actors died {restarts + 1} times (ray.actor_restarts={limit}): giving up"
        )
    return restarts + 1


def _dead_errors() -> tuple[type[BaseException], ...]:
    import ray

    return (ray.exceptions.RayActorError,)


def _driver_sees_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def bundle_resources(ray_cfg: Any, cuda: bool) -> dict[str, float]:
    """One placement bundle (a trainer rank + its rollout actor): `ray.cpus_per_bundle` CPUs and
    `ray.gpus_per_bundle` GPUs (null: 1 with CUDA, else none)."""
    gpus = ray_cfg.gpus_per_bundle if ray_cfg.gpus_per_bundle is not None else (1.0 if cuda else 0.0)
    return {"CPU": ray_cfg.cpus_per_bundle, **({"GPU": gpus} if gpus else {})}


class RayCluster:
    """Ray itself (joined or embedded) and the placement group: one bundle per trainer rank."""

    def __init__(self, cfg: RLConfig) -> None:
        self.cfg = cfg
        self.placement = None

    def start(self, model_dir: str) -> tuple[TrainerGroup, RolloutGroup]:
        """Init Ray, place the bundles, build the trainer ranks and rollout replicas (waits until all are ready)."""
        import ray

        self._init_ray()
        self._place()
        trainers = TrainerGroup(self.cfg, model_dir, self.options)
        if self._together():
            rollouts = RolloutGroup(self.cfg, model_dir, self.options)
            facts = ray.get(trainers.ready_refs() + rollouts.ready_refs())
            trainers.facts = facts[: len(trainers.actors)]
        else:  # on a GPU vLLM profiles free memory when it starts: the trainers must be loaded by then
            trainers.facts = ray.get(trainers.ready_refs())
            rollouts = RolloutGroup(self.cfg, model_dir, self.options)
            ray.get(rollouts.ready_refs())
        return trainers, rollouts

    def _together(self) -> bool:
        """`ray.start_together`, or when unset: together unless this process sees a CUDA device."""
        if self.cfg.ray.start_together is not None:
            return self.cfg.ray.start_together
        import torch

        return not torch.cuda.is_available()

    def _init_ray(self) -> None:
        import ray

        from k2post.train.console import claim_library_loggers, send_ray_output_to_log

        if ray.is_initialized():
            return
        claim_library_loggers()  # Ray's own "started a local instance" lines: to the run's log file
        ray_cfg = self.cfg.ray
        if ray_cfg.address or os.environ.get("RAY_ADDRESS"):
            ray.init(address=ray_cfg.address, log_to_driver=True)
        else:
            ray.init(num_cpus=ray_cfg.num_cpus, _temp_dir=ray_cfg.temp_dir, include_dashboard=False, log_to_driver=True)
        send_ray_output_to_log()  # the workers' vLLM / DeepSpeed lines: to the run's log file

    def _place(self) -> None:
        import ray
        from ray.util.placement_group import placement_group

        bundles = [bundle_resources(self.cfg.ray, _driver_sees_cuda())] * self.cfg.trainer.world_size
        self.placement = placement_group(bundles, strategy="PACK")
        ray.get(self.placement.ready(), timeout=120)

    def options(self, bundle: int) -> dict[str, Any]:
        """Ray options of an actor in `bundle` (a trainer rank and its replica each take half of it)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = PlacementGroupSchedulingStrategy(placement_group=self.placement, placement_group_bundle_index=bundle)
        halves = {
            key.lower(): amount / 2 for key, amount in bundle_resources(self.cfg.ray, _driver_sees_cuda()).items()
        }
        options = {"num_cpus": halves["cpu"], "num_gpus": halves.get("gpu", 0), "scheduling_strategy": strategy}
        plugins = os.environ.get(PLUGINS_ENV_VAR)
        if plugins:  # `module:Class` envs of the mix: every actor loads them too (merged into the job's runtime_env)
            options["runtime_env"] = {"env_vars": {PLUGINS_ENV_VAR: plugins}}
        return options

    def close(self, *groups: Any) -> None:
        """Kill the groups' actors and remove the placement group (Ray itself is left to whoever started it)."""
        import ray

        for group in groups:
            if group is not None:
                group.kill()
        if self.placement is not None:
            with contextlib.suppress(Exception):
                ray.util.remove_placement_group(self.placement)


def verify_this_push(index: int, every: int) -> bool:
    """Whether push `index` (0-based) is verified: the first one and then every `every`-th; never with 0."""
    return every > 0 and index % every == 0


class TrainerGroup:
    """The trainer ranks: each call goes to every rank and returns one result per rank."""

    def __init__(self, cfg: RLConfig, model_dir: str, options: Any) -> None:
        import ray

        from k2post.rl.trainer import RLTrainerWorker
        from k2post.train.distributed import free_port

        self.cfg, port, actor_cls = cfg, free_port(), ray.remote(RLTrainerWorker)
        self.pushes = 0  # pushes so far (the first one and every verify_push_every-th are verified)
        self.actors = [
            actor_cls.options(**options(r)).remote(cfg, str(model_dir), r, port) for r in range(cfg.trainer.world_size)
        ]
        self.facts: list[dict[str, Any]] = []

    def ready_refs(self) -> list[Any]:
        return [t.ready.remote() for t in self.actors]

    def _all(self, method: str, *per_rank: Sequence[Any], **same: Any) -> list[Any]:
        """Call `method` on every rank: positional args per rank (zipped), keyword args the same for all."""
        import ray

        args = zip(*per_rank) if per_rank else ([()] * len(self.actors))
        return ray.get([getattr(t, method).remote(*a, **same) for t, a in zip(self.actors, args)])

    def old_policy(self, shards: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
        """pi_old per model token of each rank's shard of sequences (the current weights), and the routing
        agreement with the engine (`RLTrainerWorker.old_policy`)."""
        return self._all("old_policy", shards)

    def train_step(self, micro: Sequence[Any], old: Sequence[Any], step: int) -> list[dict[str, Any]]:
        """One optimizer step on every rank (its micro-batches and their pi_old log-probs)."""
        return self._all("train_step", micro, old, step=step)

    def offload(self, offload: bool) -> None:
        """Params and optimizer state to DRAM (rollout) or back (training); no-op unless configured."""
        if self.cfg.trainer.offload_during_rollout:
            self._all("offload" if offload else "reload")

    def push_to(self, rollouts: RolloutGroup, version: int) -> dict[str, float]:
        """Every rank streams its weights to its replica through the checkpoint engine; timed. The first push and
        every `trainer.verify_push_every`-th are verified (`verify_pushes`). The
        engines tag what they generate from now on with `version` (the trainer's optimizer step)."""
        import ray

        verify = verify_this_push(self.pushes, self.cfg.trainer.verify_push_every)
        self.pushes += 1
        started = time.perf_counter()
        addresses = self._all("open_push")
        receives = rollouts.receive_refs(addresses, timeout_s=300.0, verify_push=verify, version=version)
        pushes = [t.push_weights.remote(verify) for t in self.actors]
        ray.wait(receives + pushes, num_returns=len(receives + pushes), timeout=600)
        received = ray.get(receives)  # a receiver's error says more than the sender's "peer gone"
        stats = ray.get(pushes)
        row = {"time/push_s": time.perf_counter() - started, "push/mb": stats[0]["nbytes"] / 2**20}
        if verify:
            row.update({**verify_pushes(stats, received), "time/push_digest_s": stats[0]["digest_s"]})
        return row

    def save(self, directory: str) -> None:
        self._all("save", directory=directory)

    def load(self, directory: str) -> None:
        self._all("load", directory=directory)

    def memory(self) -> list[dict[str, float]]:
        return self._all("memory")

    def kill(self) -> None:
        _kill(self.actors)


def verify_pushes(stats: list[dict[str, Any]], received: list[dict[str, Any]]) -> dict[str, float]:
    """A verified push: each replica received its rank's tensors (`compare_digests` of what arrived) and, after
    loading, its engine's own parameters hold each one equal or rounded to their dtype (`check_held`); an adapter push
    must map every pushed module to an engine module; with merged LoRA, no adapted weight may be the frozen base's
    (`check_adapter_arrived`). PushVerificationError otherwise. `push/verified_held` is 1 when all of that holds;
    `push/held_equal` / `push/held_rounded` count the served tensors the engines hold bit for bit / rounded."""
    from k2post.rollout.held_weights import check_held
    from k2post.rollout.weight_update import PushVerificationError, compare_digests
    from k2post.train.lora import check_adapter_arrived

    row = {"push/verified_held": 1.0}
    for replica, result in enumerate(received):
        compare_digests(stats[replica]["digests"], result["digests"])
        if "held" in result:
            counts = check_held(result["held"])
            row["push/held_equal"] = row.get("push/held_equal", 0.0) + counts["equal"]
            row["push/held_rounded"] = row.get("push/held_rounded", 0.0) + counts["rounded"]
        if stats[replica].get("lora_adapter") and not result.get("lora_modules"):
            raise PushVerificationError("the engine registered no LoRA adapter from the adapter push")
        if "lora_pushed" in result:  # the engine refused an adapter with an unmapped module (`check_mapped`)
            row["push/lora_pushed"] = float(result["lora_pushed"])
            row["push/lora_mapped"] = float(result["lora_mapped"])
        if "lora_base_digests" in stats[replica]:
            check_adapter_arrived(stats[replica]["lora_base_digests"], result["digests"])
            row["push/lora_adapted"] = float(len(stats[replica]["lora_base_digests"]))
    return row


class RolloutGroup:
    """The rollout replicas: per-replica work in, results out, dead replicas reported; restarts capped."""

    def __init__(self, cfg: RLConfig, model_dir: str, options: Any) -> None:
        self.cfg, self.model_dir, self.options = cfg, str(model_dir), options
        self.actors = [self._start(r) for r in range(cfg.rollout.replicas)]
        self.restarts = 0

    def __len__(self) -> int:
        return len(self.actors)

    def _start(self, replica: int) -> Any:
        from k2post.rollout.actor import make_rollout_actor
        from k2post.rollout.config import SamplingConfig

        rollout = self.cfg.rollout
        # the runner's defaults: every RL episode's EpisodeOptions set its temperature, seed and budget
        sampling = SamplingConfig(
            temperature=self.cfg.temperature.default.start,
            top_p=rollout.top_p,
            max_tokens=rollout.agentic.max_turn_tokens,
            logprobs=True,
        )
        engine = rollout.engine.model_copy(update={"seed": self.cfg.seed})
        env_configs, agentic = self.cfg.env_configs(), rollout.agentic
        return make_rollout_actor(
            self.model_dir, engine, env_configs, agentic, sampling, max_restarts=0, **self.options(replica)
        )

    def ready_refs(self) -> list[Any]:
        return [a.ready.remote() for a in self.actors]

    def restart(self, replica: int) -> None:
        """A fresh actor for `replica` (built from the run's starting weights: re-push after this)."""
        import ray

        self.restarts = count_restart(self.restarts, self.cfg.ray.actor_restarts)
        with contextlib.suppress(Exception):
            ray.kill(self.actors[replica])
        self.actors[replica] = self._start(replica)
        ray.get(self.actors[replica].ready.remote())

    def dead_replicas(self, timeout_s: float = 60.0) -> list[int]:
        """Replicas that do not answer a ping within `timeout_s`."""
        import ray

        dead = []
        for replica, actor in enumerate(self.actors):
            try:
                ray.get(actor.ping.remote(), timeout=timeout_s)
            except (*_dead_errors(), ray.exceptions.GetTimeoutError) as err:
                log.warning("rollout replica %d is gone (%s)", replica, type(err).__name__)
                dead.append(replica)
        return dead

    def _each(self, method: str, per_replica: Sequence[tuple[Any, ...] | None]) -> tuple[list[Any], set[int]]:
        """`method(*args)` on each replica whose args are not None: (results in replica order, dead replicas)."""
        import ray

        refs = {r: getattr(self.actors[r], method).remote(*args) for r, args in enumerate(per_replica) if args}
        results, dead = [], set()
        for replica, ref in refs.items():
            try:
                results.append(ray.get(ref))
            except _dead_errors() as err:
                log.warning("rollout replica %d died in %s (%s)", replica, method, type(err).__name__)
                dead.add(replica)
        return results, dead

    def start_episodes(self, work: Work) -> set[int]:
        """Queue each replica's episodes (run by the next `run_iteration`); returns the dead replicas."""
        return self._each("start_episodes", [(items, opts) if items else None for items, opts in work])[1]

    def run_iteration(self, iteration: int) -> tuple[list[Any], set[int]]:
        """Step every queued or paused episode one iteration: (finished episodes, dead replicas)."""
        parts, dead = self._each("run_iteration", [(iteration, False)] * len(self.actors))
        return [e for part in parts for e in part], dead

    def run_episodes(self, work: Work) -> list[Any]:
        """Run episodes to the end (the held-out eval); a dead replica is an error here."""
        import ray

        refs = [a.run_episodes.remote(items, opts) for a, (items, opts) in zip(self.actors, work) if items]
        return [e for part in ray.get(refs) for e in part]

    def score_groups(self, calls: dict[tuple[int, str], list[Any]]) -> tuple[dict[tuple[int, str], Any], set[int]]:
        """Judge complete groups on the replicas that ran them, all calls in flight at once:
        ({(replica, env_name): (rewards per group, metrics)}, dead replicas)."""
        import ray

        refs = {key: self.actors[key[0]].score_groups.remote(key[1], items) for key, items in calls.items()}
        results: dict[tuple[int, str], Any] = {}
        dead: set[int] = set()
        for key, ref in refs.items():
            try:
                results[key] = ray.get(ref)
            except _dead_errors() as err:
                log.warning("rollout replica %d died while judging %s (%s)", key[0], key[1], type(err).__name__)
                dead.add(key[0])
        return results, dead

    def sleep(self, asleep: bool) -> None:
        """Free (or re-allocate) the engines' KV cache around training; no-op unless configured."""
        import ray

        if self.cfg.rollout.sleep_during_training:
            ray.get([(a.sleep.remote() if asleep else a.wake_up.remote()) for a in self.actors])

    def receive_refs(
        self, addresses: Sequence[str | None], timeout_s: float, verify_push: bool = False, version: int | None = None
    ) -> list[Any]:
        """Start each replica receiving from its rank's sender (refs to wait on with the pushes); with
        `lora.push: adapter` the pushes are LoRA adapters."""
        adapter = None
        if self.cfg.lora.enabled and self.cfg.lora.push == "adapter":
            from k2post.rollout.lora_adapter import adapter_spec

            lora = self.cfg.lora
            adapter = adapter_spec(lora.rank, lora.alpha, lora.target_modules)
        return [
            a.receive_weights.remote(addresses[r], timeout_s, verify_push=verify_push, version=version, adapter=adapter)
            for r, a in enumerate(self.actors)
        ]

    def set_version(self, version: int) -> None:
        """Tag the weights every replica holds (after a resume: the checkpoint's optimizer step)."""
        import ray

        ray.get([a.set_weights_version.remote(version) for a in self.actors])

    def export_paused(self) -> list[list[Any]]:
        import ray

        return ray.get([a.export_paused.remote() for a in self.actors])

    def import_paused(self, paused: Sequence[list[Any]]) -> None:
        import ray

        ray.get([a.import_paused.remote(p) for a, p in zip(self.actors, paused)])

    def memory(self) -> list[dict[str, float]]:
        import ray

        return ray.get([a.memory.remote() for a in self.actors])

    def kill(self) -> None:
        _kill(self.actors)


def _kill(actors: Sequence[Any]) -> None:
    import ray

    for actor in actors:
        with contextlib.suppress(Exception):
            ray.kill(actor)
