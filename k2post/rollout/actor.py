"""`RolloutActor`: the vLLM engine inside a Ray actor, for the RL controller.

The actor owns one `VLLMEngine`, the environments its episodes run in, and the episodes paused by
partial rollout (their environment state never leaves the actor). The controller drives it:

    actor = make_rollout_actor(model_dir, VLLMEngineConfig(), envs={"tool_use": {}}, num_cpus=1)
    outs = ray.get(actor.generate.remote(prompts_ids, SamplingConfig(max_tokens=32)))
    ray.get(actor.start_episodes.remote([("tool_use", task), ...]))
    finished = ray.get(actor.run_iteration.remote(iteration=0))   # paused ones stay in the actor
    ray.get(actor.sleep.remote())                                  # trainer's turn
    ray.get(actor.wake_up.remote())
    ref = actor.receive_weights.remote(sender.address)             # checkpoint-engine push:
    sender.push(); ray.get(ref)                                    # trainer side streams buckets

`RolloutWorker` is the plain class (usable without Ray); `make_rollout_actor` wraps it with
`ray.remote` and starts it with the given resources.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from k2post.chat.types import Message, ToolSpec
from k2post.envs.base import Environment, Task
from k2post.envs.registry import make_environment
from k2post.rollout.agentic import AgenticRollout, Episode, EpisodeOptions, score_episode
from k2post.rollout.config import AgenticRolloutConfig, SamplingConfig, VLLMEngineConfig
from k2post.rollout.engine import ChatTurn, Generation
from k2post.rollout.sleep import SleepStats


class RolloutWorker:
    """One engine + environments + paused episodes; every method is a remote call on the actor."""

    def __init__(
        self,
        model_path: str | Path,
        engine_cfg: VLLMEngineConfig,
        envs: dict[str, dict[str, Any]] | None = None,
        rollout_cfg: AgenticRolloutConfig | None = None,
        sampling: SamplingConfig | None = None,
    ):
        from k2post.rollout.vllm_engine import VLLMEngine

        self.engine = VLLMEngine(model_path, engine_cfg)
        self.envs: dict[str, Environment] = {name: make_environment(name, cfg) for name, cfg in (envs or {}).items()}
        self.rollout_cfg = rollout_cfg or AgenticRolloutConfig()
        self.sampling = sampling or SamplingConfig()
        self.episodes: list[Episode] = []

    def ready(self) -> dict[str, Any]:
        """Engine facts once it is built (the controller waits on this)."""
        return {
            "model_path": self.engine.model_path,
            "weight_update_mode": self.engine.weight_update_mode,
            "weights_version": self.engine.weights_version,
            "cpu": self.engine.cpu,
            "pid": os.getpid(),
        }

    def generate(self, prompts_ids: list[list[int]], sampling: SamplingConfig) -> list[list[Generation]]:
        """Token-level generation (see `VLLMEngine.generate`)."""
        return self.engine.generate(prompts_ids, sampling)

    def chat(
        self, dialogues: list[list[Message]], sampling: SamplingConfig, tools: list[ToolSpec] | None = None
    ) -> list[ChatTurn]:
        """One parsed assistant turn per dialogue (see `VLLMEngine.chat`)."""
        return self.engine.chat(dialogues, sampling, tools)

    # --- agentic episodes --------------------------------------------------------------------

    def _runner(self) -> AgenticRollout:
        return AgenticRollout(self.engine, self.envs, self.rollout_cfg, self.sampling)

    def start_episodes(self, items: list[tuple[str, Task]], options: list[EpisodeOptions] | None = None) -> int:
        """Queue new episodes `(env_name, task)`; returns how many are queued or paused in all.

        `options` (one per item) set the episode's id, sampling temperature, seed and token budget."""
        unknown = sorted({name for name, _ in items} - set(self.envs))
        if unknown:
            raise KeyError(
                f"episodes name environments {unknown} this actor was not built with (has {sorted(self.envs)})"
            )
        if options is not None and len(options) != len(items):
            raise ValueError(f"options has {len(options)} entries for {len(items)} episodes")
        runner = self._runner()
        taken = {episode.id for episode in self.episodes}
        for position, (name, task) in enumerate(items):
            chosen = options[position] if options else EpisodeOptions()
            episode_id = chosen.id or task.id
            if episode_id in taken:
                episode_id = f"{episode_id}#{len(self.episodes) + position}"
            taken.add(episode_id)
            self.episodes.append(runner.start(name, task, episode_id, chosen))
        return len(self.episodes)

    def run_episodes(
        self, items: list[tuple[str, Task]], options: list[EpisodeOptions] | None = None, iteration: int = 0
    ) -> list[Episode]:
        """Run episodes to the end apart from the queued/paused ones (held-out eval), scored in the actor
        only by the caller: rewards are left unset."""
        queued, self.episodes = self.episodes, []
        try:
            self.start_episodes(items, options)
            started, self.episodes = self.episodes, []
            cfg = self.rollout_cfg.model_copy(update={"iteration_token_budget": None})
            result = AgenticRollout(self.engine, self.envs, cfg, self.sampling).run_iteration(started, iteration)
            return result.finished
        finally:
            self.episodes = queued

    def memory(self) -> dict[str, float]:
        """RSS now and peak of this actor's process (MiB)."""
        from k2post.train.memory import peak_rss_mib, rss_mib

        return {"rss_mib": rss_mib(), "peak_rss_mib": peak_rss_mib()}

    def export_paused(self) -> list[Episode]:
        """The paused episodes (for a checkpoint: they pickle with their environment state)."""
        return list(self.episodes)

    def import_paused(self, episodes: list[Episode]) -> int:
        """Replace the paused episodes by `episodes` (resume, or a restarted actor taking over)."""
        self.episodes = list(episodes)
        return len(self.episodes)

    def ping(self) -> bool:
        """Liveness check for the controller."""
        return True

    def run_iteration(self, iteration: int = 0, score: bool = True) -> list[Episode]:
        """Step every queued/paused episode for one iteration; returns the finished ones (scored
        into `Episode.reward` when `score`) and keeps the paused ones for the next iteration.

        The engine's prefix cache is emptied first, so an iteration's rollouts depend only on the weights and the
        episodes: a paused episode is re-prefilled whether or not its KV blocks survived (they do when no push
        came between, never in a resumed run), which keeps a resumed run bit-identical to an uninterrupted one."""
        reset = getattr(self.engine, "reset_prefix_cache", None)
        if callable(reset):
            reset()
        result = self._runner().run_iteration(self.episodes, iteration)
        self.episodes = result.paused
        if score:
            for episode in result.finished:
                episode.reward = score_episode(self.envs[episode.env_name], episode)
        return result.finished

    def score_groups(
        self, env_name: str, items: list[tuple[Task, list[str]]]
    ) -> tuple[list[list[Any]], dict[str, float]]:
        """Rewards of complete groups of a group-scored environment (a critic), judged with this actor's engine
        as the policy's client (K2: the actor is its own critic); returns (rewards per group, metrics)."""
        from k2post.llm.engine_client import EngineLLMClient

        env = self.envs[env_name]
        if not getattr(env, "group_scored", False):
            raise ValueError(f"environment {env_name!r} is not group-scored")
        return env.score_groups(items, EngineLLMClient(self.engine))

    def paused_episodes(self) -> list[str]:
        """Ids of the episodes waiting for the next iteration."""
        return [episode.id for episode in self.episodes]

    # --- weights and memory --------------------------------------------------------------------

    def load_weights(self, named_tensors: list[tuple[str, Any]]) -> int:
        """Push tensors sent through Ray's object store (small models; prefer receive_weights)."""
        return self.engine.load_weights(named_tensors)

    def receive_weights(
        self,
        address: str,
        timeout_s: float = 60.0,
        verify_checksum: bool = True,
        verify_push: bool = False,
        version: int | None = None,
        adapter: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Receive one checkpoint-engine update from the sender at `address` into the engine
        (see `VLLMEngine.receive_update`; `verify_push`: the loaded tensors' digests come back; `version`: the
        policy version the tokens generated from now on are tagged with; `adapter`: a LoRA adapter-only push)."""
        return self.engine.receive_update(
            address, timeout_s=timeout_s, verify_checksum=verify_checksum, verify_push=verify_push, version=version,
            adapter=adapter,
        )  # fmt: skip

    def set_weights_version(self, version: int) -> int:
        """Tag the weights the engine holds (a resumed run's engine starts from its checkpoint's step)."""
        self.engine.weights_version = version
        return version

    def weights_version(self) -> int:
        """How many weight updates the engine has taken."""
        return self.engine.weights_version

    def sleep(self, level: int = 1) -> SleepStats:
        """Free the engine's memory for the trainer (see `VLLMEngine.sleep`)."""
        return self.engine.sleep(level)

    def wake_up(self) -> SleepStats:
        """Re-allocate what sleep() freed."""
        return self.engine.wake_up()


def make_rollout_actor(
    model_path: str | Path,
    engine_cfg: VLLMEngineConfig,
    envs: dict[str, dict[str, Any]] | None = None,
    rollout_cfg: AgenticRolloutConfig | None = None,
    sampling: SamplingConfig | None = None,
    **ray_options: Any,
):
    """Start a `RolloutActor` (Ray must be initialized); `ray_options` go to `.options()`
    (num_cpus, num_gpus, placement_group, scheduling_strategy, ...)."""
    import ray

    options = {"num_cpus": 1, **ray_options}
    actor_cls = ray.remote(RolloutWorker)
    return actor_cls.options(**options).remote(str(model_path), engine_cfg, envs, rollout_cfg, sampling)
