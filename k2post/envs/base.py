"""The Environment seam: gym-like RL environments that speak chat messages, never tokens.

Single-turn environments hand out `Task`s and score one assistant response:

    env = make_environment("math")
    task = next(env.tasks("train", seed=0))
    reward = env.score(task, "The answer is \\boxed{42}")   # Reward(value, breakdown, info)

Multi-turn environments also step on assistant messages (with tool calls) until done:

    state = env.reset(task)
    result = env.step(state, assistant_message)               # StepResult(observations, done)
    reward = env.score_state(task, state)

Scoring untrusted model output should go through `k2post.envs.workers.RewardPool`
(process isolation, timeouts); `score` itself may raise on junk — the pool turns that into
the env's minimum reward with a recorded error (built-in gyms must not raise: they are fuzzed).
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from k2post.chat.types import Message, ToolSpec
from k2post.config.base import K2Config
from k2post.envs.splits import Split


class Reward(BaseModel):
    """A scalar reward with a per-criterion breakdown (e.g. one entry per constraint/checkpoint)."""

    model_config = ConfigDict(frozen=True)

    value: float = Field(description="The reward used by the RL loss, inside the env's reward_range.")
    breakdown: dict[str, float] = Field(default_factory=dict, description="Named partial scores.")
    info: dict[str, Any] = Field(default_factory=dict, description="Extra JSON-able details (extracted answer, ...).")
    error: str | None = Field(
        None, description="Set when scoring failed (exception, timeout); value is then the env's reward_range minimum."
    )
    infra_failure: bool = Field(
        False,
        description="The scoring failed for a reason outside the response (a reward worker died, the sandbox could "
        "not start, the pool's own timeout): the value says nothing about the response. Re-scored once; if it fails "
        "again the episode is left out of training and counted (reward/infra_failures), never trained on as 0. "
        "Needs `error`. A failure the response causes (junk output, a forged record) is a failed response instead.",
    )

    @model_validator(mode="after")
    def _infra_needs_error(self) -> Reward:
        if self.infra_failure and self.error is None:
            raise ValueError("infra_failure=True needs the error text: set error to what failed")
        return self


class Task(BaseModel):
    """One prompt of an environment: chat messages plus whatever the scorer needs (JSON-able)."""

    model_config = ConfigDict(frozen=True)

    id: str = Field(description="Stable id, unique within the environment and split.")
    env: str = Field(description="Name of the environment that made it.")
    task_type: str = Field(description="Task type (budgets and temperature schedules are keyed by it).")
    messages: list[Message] = Field(description="The prompt as chat messages (system/user).")
    answer: Any = Field(None, description="Gold answer / reference data for the scorer (JSON-able).")
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="Extra JSON-able data (difficulty, source, ...)."
    )


Play = str | list[Message]
"""One attempt at a task: a single-turn response, or a multi-turn env's assistant turns played in order (the
episode ends when the env says done or the turns run out)."""


class HonestPair(BaseModel):
    """An honest-right and an honest-wrong attempt at one task (what every cheap strategy must score below)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    right: Play = Field(description="Solves the task as the env asks (the answer it wants, in its format).")
    wrong: Play = Field(description="An on-task attempt in the env's format whose result is wrong.")


class StepResult(BaseModel):
    """What a multi-turn environment returns after an assistant turn."""

    observations: list[Message] = Field(default_factory=list, description="Tool results / user replies to append.")
    done: bool = Field(False, description="The episode is over.")


class EnvConfig(K2Config):
    """Base of every environment's config (subclass it and add fields)."""


class Environment(abc.ABC):
    """Base class: declares name, task type, tools and reward range; makes tasks."""

    name: ClassVar[str] = ""
    task_type: ClassVar[str] = ""
    reward_range: ClassVar[tuple[float, float]] = (0.0, 1.0)
    config_cls: ClassVar[type[EnvConfig]] = EnvConfig
    multi_turn: ClassVar[bool] = False
    group_scored: ClassVar[bool] = False
    """True for `GroupScoredEnvironment`s: their reward compares the K responses to one prompt."""
    chance_reward: ClassVar[float | None] = None
    """For a gym whose answer is a choice among a few options (a pairwise critic's [[A]] / [[B]]): the mean reward of
    a blind guess. The adversarial suite's bar for a strategy's mean is then the higher of honest-wrong's mean and
    this plus the luck of a guess on the tasks scored (a constant or surface-cue answer that does no better than
    guessing is not a hack; better is)."""
    golden_path: ClassVar[str | None] = None
    """Golden file of a third-party env, relative to its module's folder (built-ins use
    environments/golden/<name>.jsonl); `k2post envs test NAME` finds it without --golden."""

    def __init__(self, config: EnvConfig | None = None) -> None:
        self.config = config if config is not None else self.config_cls()

    def tools(self) -> list[ToolSpec]:
        """Tools the model may call, as MCP/OpenAI-style JSON schemas (empty for plain Q&A)."""
        return []

    def worked_solution(self, task: Task) -> str | None:
        """The steps that lead to `task`'s gold answer, as text (e.g. "7 - 3 = 4, 4 + 9 = 13"), or None when
        the environment cannot write them; SFT data synthesis renders it in a `{steps}` reply slot."""
        return None

    def honest(self, task: Task) -> HonestPair | None:
        """An honest-right and an honest-wrong answer to `task`, for the adversarial suite
        (`k2post.envs.adversary`): right solves it; wrong is an on-task attempt in the expected format whose
        result is wrong (a near-miss number, a plausible but unsupported claim). None: the env provides none,
        and the suite cannot judge it."""
        return None

    def hacks(self, task: Task) -> dict[str, Play]:
        """Cheap strategies particular to this env (named; e.g. "more_digits" for a critic), scored by the
        adversarial suite beside its generic ones (empty, filler, copies, hedges, injections, ...)."""
        return {}

    @abc.abstractmethod
    def tasks(self, split: Split = "train", seed: int = 0, n: int | None = None) -> Iterator[Task]:
        """Tasks of a split (train, dev, test, shifted: `k2post.envs.splits`); train, dev and test are
        disjoint by content and deterministic, shifted is disjoint from train; an environment
        without a split raises `k2post.envs.splits.unsupported_split`."""

    @abc.abstractmethod
    def score(self, task: Task, response: str) -> Reward:
        """Score the final assistant response text of a single-turn episode."""


class MultiTurnEnvironment(Environment):
    """Environment with tool calls / several turns: reset, step until done, then score the state."""

    multi_turn: ClassVar[bool] = True
    max_turns: ClassVar[int] = 8

    @abc.abstractmethod
    def reset(self, task: Task) -> Any:
        """A fresh episode state for `task` (JSON-able or a small object the env understands)."""

    @abc.abstractmethod
    def step(self, state: Any, assistant: Message) -> StepResult:
        """Apply one assistant turn (its tool calls) to `state`; return observations and done."""

    @abc.abstractmethod
    def score_state(self, task: Task, state: Any) -> Reward:
        """Reward of a finished (or truncated) episode from its final state."""

    def score(self, task: Task, response: str) -> Reward:
        """Single-turn view: a response without tool calls leaves the state as reset."""
        text = response if isinstance(response, str) else "" if response is None else str(response)
        state = self.reset(task)
        self.step(state, Message(role="assistant", content=text))  # a non-string (model output is hostile): as text
        return self.score_state(task, state)


class GroupScoredEnvironment(Environment):
    """Single-turn environment whose reward compares the K responses to one prompt (a critic).

    The RL controller holds such a group's episodes until all K are in, then calls `score_groups`
    where the policy's engine lives (the rollout actor), handing it an `LLMClient` over that
    engine (K2: the actor is its own critic). `score` is the part that needs no judge (e.g.
    deterministic rubric checks): what `k2post eval` and the reward workers use.
    """

    group_scored: ClassVar[bool] = True

    @abc.abstractmethod
    def score_groups(
        self, items: list[tuple[Task, list[str]]], policy_client: Any
    ) -> tuple[list[list[Reward]], dict[str, float]]:
        """Rewards of each (task, K responses) group, plus metrics of the scoring (calls, tokens, ...)."""
