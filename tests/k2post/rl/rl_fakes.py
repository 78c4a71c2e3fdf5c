"""In-process fakes of the RL controller's actor facades (k2post/rl/actors.py), for unit tests of the loop.

`FakeCluster.start` returns a `FakeTrainerGroup` and a `FakeRolloutGroup` with the facades' methods and
return shapes, no Ray, no model:
- the trainer's "weights" are a version number (one per optimizer step); `save`/`load` write it to a file;
- a replica answers a math task correctly (\\boxed{answer}) when its episode seed is even, so groups have
  mixed rewards; greedy eval answers correctly once the replica has received a push (version >= 1);
- with `pause_odd=True` an episode with an odd index pauses one iteration before it finishes (partial rollout);
- `die[iteration] = replica` kills that replica during that iteration's `run_iteration` (its episodes are lost);
- episodes are 5 tokens (2 prompt + 3 written); a train step reports `time/trainer_step_s` = STEP_S.
Every call is recorded in `calls` as (method, args summary).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from k2post.chat.types import Message
from k2post.rl.actors import count_restart
from k2post.rollout.agentic import Episode

STEP_S = 0.5  # the fake trainer's step time (`time/trainer_step_s`)


class FakeTrainerGroup:
    def __init__(self, world_size: int, calls: list) -> None:
        self.world_size, self.calls, self.version = world_size, calls, 0
        self.facts = [{"rank": r} for r in range(world_size)]

    def old_policy(self, shards):
        """pi_old per model token: the engine's log-probs shifted by -0.01 (a small, known mismatch)."""
        self.calls.append(("old_policy", [len(s) for s in shards]))
        return [
            {
                "token_logprobs": [[lp - 0.01 for lp in row.behaviour_logprobs] for row in shard],
                "routing": {"tokens": 0, "disagree": 0, "disagree_used": 0},
            }
            for shard in shards
        ]

    def train_step(self, micro, old, step):
        self.calls.append(("train_step", step))
        self.version += 1
        rows = [{"train/k15_loss": 0.1 * step, "train/rows": sum(len(m) for m in ms)} for ms in micro]
        return [{**row, "time/trainer_step_s": STEP_S} for row in rows]

    def offload(self, offload: bool) -> None:
        self.calls.append(("offload", offload))

    def push_to(self, rollouts: FakeRolloutGroup, version: int) -> dict[str, float]:  # verification: rollout tests
        assert version == self.version, (version, self.version)  # the controller tags pushes with its step
        self.calls.append(("push", self.version))
        rollouts.versions = [self.version] * len(rollouts)
        return {"time/push_s": 0.0, "push/mb": 1.0}

    def save(self, directory: str) -> None:
        (Path(directory) / "weights.json").write_text(json.dumps({"version": self.version}))

    def load(self, directory: str) -> None:
        self.version = json.loads((Path(directory) / "weights.json").read_text())["version"]

    def memory(self):
        return [{"rss_mib": 10.0, "peak_rss_mib": 20.0}] * self.world_size

    def kill(self) -> None:
        self.calls.append(("kill_trainers", None))


class FakeRolloutGroup:
    def __init__(self, replicas: int, restart_limit: int, calls: list, pause_odd: bool, die: dict[int, int]) -> None:
        self.calls, self.pause_odd, self.die, self.restart_limit = calls, pause_odd, die, restart_limit
        self.queued: list[list[tuple[Any, Any, int]]] = [[] for _ in range(replicas)]  # (item, options, age)
        self.versions = [0] * replicas
        self.restarts = 0

    def __len__(self) -> int:
        return len(self.versions)

    def dead_replicas(self, timeout_s: float = 60.0) -> list[int]:
        return []

    def restart(self, replica: int) -> None:
        self.restarts = count_restart(self.restarts, self.restart_limit)
        self.calls.append(("restart", replica))
        self.queued[replica], self.versions[replica] = [], 0  # a new actor from the starting weights

    def start_episodes(self, work) -> set[int]:
        for replica, (items, options) in enumerate(work):
            self.calls.append(("start_episodes", replica, [o.id for o in options]))
            self.queued[replica] += [(item, opt, 0) for item, opt in zip(items, options)]
        return set()

    def run_iteration(self, iteration: int):
        finished, dead = [], set()
        for replica, queue in enumerate(self.queued):
            if self.die.get(iteration) == replica:
                self.queued[replica], dead = [], {replica}
                continue
            waiting = []
            for item, opt, age in queue:
                if self.pause_odd and age == 0 and int(opt.id.rsplit("/", 1)[1]) % 2:
                    waiting.append((item, opt, age + 1))
                else:
                    finished.append(self._episode(item, opt, self.versions[replica]))
            self.queued[replica] = waiting
        return finished, dead

    def run_episodes(self, work):
        return [
            self._episode(item, opt, self.versions[replica], greedy=True)
            for replica, (items, options) in enumerate(work)
            for item, opt in zip(items, options)
        ]

    def score_groups(self, calls):
        return {}, set()

    @staticmethod
    def _episode(item, options, version: int, greedy: bool = False) -> Episode:
        env_name, task = item
        right = version >= 1 if greedy else options.seed % 2 == 0
        text = f"\\boxed{{{task.answer if right else 'nope'}}}"
        messages = [*task.messages, Message(role="assistant", content=text)]
        return Episode(
            id=options.id,
            env_name=env_name,
            task=task,
            state=None,
            tools=[],
            messages=messages,
            token_ids=[5, 6, 7, 8, 9],
            prompt_len=2,
            loss_mask=[0, 0, 1, 1, 1],
            logprobs=[0.0, 0.0, -0.5, -0.5, -0.5],
            versions=[-1, -1, version, version, version],
            finish_reason="env_done",
            generated_tokens=3,
            temperature=options.temperature,
            seed=options.seed,
            max_tokens=options.max_tokens,
        )

    def sleep(self, asleep: bool) -> None:
        self.calls.append(("sleep", asleep))

    def set_version(self, version: int) -> None:
        self.versions = [version] * len(self)

    def export_paused(self):
        return [list(queue) for queue in self.queued]

    def import_paused(self, paused) -> None:
        self.queued = [list(queue) for queue in paused]

    def memory(self):
        return [{"rss_mib": 5.0, "peak_rss_mib": 6.0}] * len(self)

    def kill(self) -> None:
        self.calls.append(("kill_rollouts", None))


class FakeCluster:
    """`RLRun(cfg, cluster=FakeCluster(...))`: the groups above instead of Ray actors."""

    def __init__(self, cfg, pause_odd: bool = False, die: dict[int, int] | None = None) -> None:
        self.cfg, self.pause_odd, self.die = cfg, pause_odd, die or {}
        self.calls: list = []
        self.trainers: FakeTrainerGroup | None = None
        self.rollouts: FakeRolloutGroup | None = None

    def start(self, model_dir: str):
        self.calls.append(("start", model_dir))
        self.trainers = FakeTrainerGroup(self.cfg.trainer.world_size, self.calls)
        self.rollouts = FakeRolloutGroup(
            self.cfg.rollout.replicas, self.cfg.ray.actor_restarts, self.calls, self.pause_odd, self.die
        )
        return self.trainers, self.rollouts

    def close(self, *groups) -> None:
        for group in groups:
            if group is not None:
                group.kill()
