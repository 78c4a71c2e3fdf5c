"""Agentic rollouts: many multi-turn episodes stepped together, with partial rollout.

Each round, every running episode's token transcript goes into one batched `engine.generate`
call (vLLM schedules them together); then each finished turn is parsed, its tool calls are run
by the environment's `step`, and the tool results are appended as tokens. An episode ends when the
environment says done, at `max_turns`, at its token budget, at its reasoning-token budget (tokens inside
`<think>...</think>` over all turns; the generation is cut at the budget) or at the model's context length.

    runner = AgenticRollout(engine, {"tool_use": env}, AgenticRolloutConfig(iteration_token_budget=128), sampling)
    episodes = [runner.start(env_name, task) for task in tasks]
    result = runner.run_iteration(episodes, iteration=0)       # RolloutResult(finished, paused)
    ... push new weights ...
    result = runner.run_iteration(result.paused + new_episodes, iteration=1)

Records are token-exact: `Episode.token_ids` is the whole transcript (prompt, model tokens, tool
results), `loss_mask` marks the model-written tokens, `logprobs` their engine log-probs and
`versions` the policy version (`engine.weights_version`) that wrote each of them, so an episode
paused mid-turn and resumed after a weight push shows which version produced which tokens
(`Episode.segments`).

Model output is hostile: a malformed tool call is answered with a tool message starting with
`Error:` (the environment never sees it), an environment that raises ends only that episode
(`finish_reason="env_error"`), and over-long tool results are cut to `max_observation_tokens`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from k2post.chat.parse import SOFT_ERRORS, ToolCallParseError
from k2post.chat.template import render_continuation_ids, render_ids, render_transcript_ids, special_token_ids
from k2post.chat.tokens import THINK_BEGIN, THINK_END
from k2post.chat.types import Message, ToolSpec, format_call_id
from k2post.envs.base import Environment, MultiTurnEnvironment, Reward, Task
from k2post.envs.workers import check_reward, scorer_error_text
from k2post.rollout.config import AgenticRolloutConfig, SamplingConfig
from k2post.rollout.context import elide_messages
from k2post.rollout.routing_capture import merge_first
from k2post.rollout.engine import Generation, RolloutEngine, parse_generation, turn_stop_ids, with_turn_stops

log = logging.getLogger(__name__)

Status = Literal["running", "paused", "done"]
FinishReason = Literal[
    "env_done", "max_turns", "turn_budget", "episode_budget", "reasoning_budget", "context_limit", "env_error"
]
TRUNCATED_REASONS = ("max_turns", "turn_budget", "episode_budget", "reasoning_budget", "context_limit")
ERROR_PREFIX = "Error: "


@dataclass(frozen=True)
class Segment:
    """A run of model-written tokens `token_ids[start:end]` from one policy version and iteration."""

    start: int
    end: int
    policy_version: int
    iteration: int


@dataclass
class Window:
    """An earlier context window of an elided episode (docs/ROLLOUT.md, "Long episodes"): its transcript exactly as
    the engine saw and wrote it; trained as its own row with the episode's advantage."""

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    versions: list[int]
    routing: Any = None
    segments: list[Segment] = field(default_factory=list)
    messages: int = 0  # dialogue messages when the window closed (episode.messages[:messages] rendered its prompt)


@dataclass(frozen=True)
class EpisodeOptions:
    """Per-episode settings the caller picks (the RL controller, the held-out eval); None keeps the runner's."""

    id: str | None = None  # episode id (None: the task's id)
    seed: int | None = None  # sampling seed: each generation uses episode_seed(seed, len(token_ids))
    temperature: float | None = None  # sampling temperature (None: the runner's sampling)
    max_tokens: int | None = None  # budget of model-written tokens (None: cfg.max_episode_tokens)
    max_reasoning_tokens: int | None = None  # budget of reasoning tokens over the episode (None: no own budget)


@dataclass
class Episode:
    """One multi-turn episode: environment state, dialogue and the token-exact transcript."""

    id: str
    env_name: str
    task: Task
    state: Any
    tools: list[ToolSpec]
    messages: list[Message]
    token_ids: list[int]
    prompt_len: int
    loss_mask: list[int] = field(default_factory=list)  # [len(token_ids)]; 1 = written by the model
    logprobs: list[float] = field(default_factory=list)  # [len(token_ids)]; 0.0 where loss_mask == 0
    versions: list[int] = field(default_factory=list)  # [len(token_ids)]; -1 where loss_mask == 0
    routing: Any = None  # record_routing: int16 [len(token_ids), moe_layers, top_k], first record per position
    segments: list[Segment] = field(default_factory=list)
    env_turns: list[Message] = field(default_factory=list)  # assistant turns handed to env.step
    turn_start: int = 0  # where the current assistant turn starts in token_ids
    turns: int = 0
    generated_tokens: int = 0
    call_index: int = 0
    status: Status = "running"
    finish_reason: FinishReason | None = None
    errors: list[str] = field(default_factory=list)
    reward: Reward | None = None  # set by whoever scores the finished episode
    temperature: float | None = None  # per-episode sampling temperature (None: the runner's sampling)
    seed: int | None = None  # per-episode sampling seed: each generation uses episode_seed(seed, len(token_ids))
    max_tokens: int | None = None  # per-episode budget of model-written tokens (None: cfg.max_episode_tokens)
    max_reasoning_tokens: int | None = None  # per-episode budget of reasoning tokens (None: none of its own)
    reasoning_tokens: int = 0  # model-written tokens inside <think>...</think> so far (the tags not counted)
    in_think: bool = False  # the transcript ends inside an open <think> (a model-written one, or the prompt's)
    windows: list[Window] = field(default_factory=list)  # context management: earlier windows (token_ids: current)
    elided_turns: int = 0  # assistant turns elided in the current window's prompt
    context_peak: int = 0  # longest context (tokens) any generation of the episode saw

    @property
    def truncated(self) -> bool:
        """The episode was cut by a limit rather than ended by the environment."""
        return self.finish_reason in TRUNCATED_REASONS

    @property
    def response_ids(self) -> list[int]:
        """Everything after the prompt (model tokens and tool results)."""
        return self.token_ids[self.prompt_len :]

    def policy_versions(self) -> list[int]:
        """Distinct policy versions that wrote tokens of this episode (every window), in order."""
        segments = [*(s for w in self.windows for s in w.segments), *self.segments]
        return sorted({segment.policy_version for segment in segments})


@dataclass
class RolloutResult:
    """One iteration's outcome: finished episodes, and paused ones to resume next iteration."""

    finished: list[Episode]
    paused: list[Episode]
    generated_tokens: int = 0
    rounds: int = 0


def episode_seed(seed: int, position: int) -> int:
    """Seed of the generation that starts at transcript length `position`: a pure function of the
    episode's seed and where it stands, so a resumed run samples exactly what the first one did."""
    return (seed * 1_000_003 + position * 7919) % (1 << 31)


def _tools_of(env: Environment, task: Task) -> list[ToolSpec]:
    tools_for = getattr(env, "tools_for", None)
    return list(tools_for(task)) if callable(tools_for) else list(env.tools())


def _finish(episode: Episode, reason: FinishReason, error: str | None = None) -> None:
    episode.status, episode.finish_reason = "done", reason
    if error:
        episode.errors.append(error)


def _append(
    episode: Episode, ids: Sequence[int], written: bool, logprobs: Sequence[float] = (), version: int = -1
) -> None:
    """Append tokens to the transcript with their mask, log-probs and policy version."""
    episode.token_ids.extend(ids)
    episode.loss_mask.extend([1 if written else 0] * len(ids))
    episode.logprobs.extend(list(logprobs) if written else [0.0] * len(ids))
    episode.versions.extend([version if written else -1] * len(ids))


def count_reasoning(
    ids: Sequence[int], in_think: bool, think_ids: tuple[int, int], remaining: int | None
) -> tuple[int, int | None, bool]:
    """Reasoning tokens among model-written `ids` (tokens strictly between `<think>` and `</think>`; the transcript
    is `in_think` before them). Returns (count, cut, in_think after): `cut` is the length to keep when the count
    reaches `remaining` (the budget left; None: no budget), i.e. the reasoning is cut after its `remaining`-th token.
    """
    begin, end = think_ids
    count = 0
    for position, token in enumerate(ids):
        if token == begin:
            in_think = True
        elif token == end:
            in_think = False
        elif in_think:
            count += 1
            if remaining is not None and count >= remaining:
                return count, position + 1, in_think
    return count, None, in_think


def truncate_observation(tokenizer, message: Message, max_tokens: int) -> Message:
    """`message` with its content cut to `max_tokens` tokens (a marker says how many were cut)."""
    ids = tokenizer(message.content, add_special_tokens=False)["input_ids"]
    if len(ids) <= max_tokens:
        return message
    kept = tokenizer.decode(ids[:max_tokens], skip_special_tokens=True)
    return message.model_copy(update={"content": f"{kept}\n[... {len(ids) - max_tokens} tokens cut]"})


def parse_error_messages(errors: Sequence[ToolCallParseError], first_index: int) -> list[Message]:
    """Tool messages telling the model what was wrong; turn-level errors get `functions.invalid:IDX`."""
    messages = []
    for offset, error in enumerate(errors):
        message = error.to_tool_message()
        if message is None:
            call_id = format_call_id("invalid", first_index + offset)
            message = Message(
                role="tool", tool_call_id=call_id, content=f"{ERROR_PREFIX}{error.message}", name="invalid"
            )
        messages.append(message)
    return messages


class AgenticRollout:
    """Steps episodes of registered environments against a `RolloutEngine`."""

    def __init__(
        self,
        engine: RolloutEngine,
        envs: Mapping[str, Environment],
        cfg: AgenticRolloutConfig,
        sampling: SamplingConfig,
        max_model_len: int | None = None,
    ):
        if sampling.n != 1:
            raise ValueError(
                f"agentic rollouts sample one continuation per episode: sampling.n must be 1, got {sampling.n} "
                "(start K episodes per task instead)"
            )
        self.engine, self.envs, self.cfg = engine, dict(envs), cfg
        self.tokenizer = engine.tokenizer
        # The runner decodes turns itself, so the engine need not build text (stop strings need it).
        self.sampling = with_turn_stops(sampling, self.tokenizer).model_copy(update={"detokenize": bool(sampling.stop)})
        self.stop_ids = set(turn_stop_ids(self.tokenizer))
        self.think_ids = (special_token_ids(self.tokenizer)[THINK_BEGIN], special_token_ids(self.tokenizer)[THINK_END])
        engine_cfg = getattr(engine, "cfg", None)
        self.max_model_len = max_model_len or getattr(engine_cfg, "max_model_len", 1 << 30)

    # --- starting --------------------------------------------------------------------------

    def start(
        self, env_name: str, task: Task, episode_id: str | None = None, options: EpisodeOptions | None = None
    ) -> Episode:
        """A new episode on `task` with `options`' seed, temperature and budget (reset errors end it at once with
        `env_error`)."""
        options = options or EpisodeOptions()
        env = self.envs[env_name]
        tools = _tools_of(env, task)
        prompt = render_ids(self.tokenizer, task.messages, tools=tools, add_generation_prompt=True).input_ids
        episode = Episode(
            id=episode_id or task.id,
            env_name=env_name,
            task=task,
            state=None,
            tools=tools,
            messages=list(task.messages),
            token_ids=[],
            prompt_len=len(prompt),
            temperature=options.temperature,
            seed=options.seed,
            max_tokens=options.max_tokens,
            max_reasoning_tokens=options.max_reasoning_tokens,
        )
        _append(episode, prompt, written=False)
        episode.turn_start = len(episode.token_ids)
        episode.in_think = self._opens_think(prompt)
        try:
            episode.state = env.reset(task) if isinstance(env, MultiTurnEnvironment) else None
        except Exception as err:  # a broken environment must not take the run down
            _finish(episode, "env_error", f"reset: {type(err).__name__}: {err}")
        return episode

    # --- one iteration ---------------------------------------------------------------------

    def run_iteration(self, episodes: Sequence[Episode], iteration: int = 0) -> RolloutResult:
        """Step the episodes until each is done or has spent this iteration's token budget."""
        spent = {episode.id: 0 for episode in episodes}
        for episode in episodes:
            if episode.status == "paused":
                episode.status = "running"
        rounds = 0
        while True:
            active = [e for e in episodes if e.status == "running"]
            if not active:
                break
            for start in range(0, len(active), self.cfg.max_concurrent_episodes):
                self._round(active[start : start + self.cfg.max_concurrent_episodes], spent, iteration)
            rounds += 1
        finished = [e for e in episodes if e.status == "done"]
        paused = [e for e in episodes if e.status == "paused"]
        return RolloutResult(finished, paused, sum(spent.values()), rounds)

    def _caps(self, episode: Episode, spent: int) -> dict[str, int]:
        """Token caps on the next generation, by the reason hitting them would give (on a tie the
        first listed wins: a hard limit ends the episode rather than pausing it)."""
        caps = {
            "context_limit": self.max_model_len - len(episode.token_ids),
            "episode_budget": (episode.max_tokens or self.cfg.max_episode_tokens) - episode.generated_tokens,
            "turn_budget": self.cfg.max_turn_tokens - (len(episode.token_ids) - episode.turn_start),
        }
        if self.cfg.iteration_token_budget is not None:
            caps["paused"] = self.cfg.iteration_token_budget - spent
        return caps

    def _round(self, batch: list[Episode], spent: dict[str, int], iteration: int) -> None:
        """One batched generate call for `batch`, then each episode takes its turn."""
        ready, limits = [], []
        for episode in batch:
            self._maybe_elide(episode)
            caps = self._caps(episode, spent[episode.id])
            reason = min(caps, key=caps.get)
            if caps[reason] <= 0:
                self._stop_at_cap(episode, reason)
            else:
                ready.append(episode)
                limits.append((caps[reason], reason))
        if not ready:
            return
        samplings = [self._sampling_for(episode, cap) for episode, (cap, _) in zip(ready, limits)]
        generations = self._generate(ready, samplings)
        version = int(self.engine.weights_version)
        for episode, generation, (cap, reason) in zip(ready, generations, limits):
            spent[episode.id] += len(generation.token_ids)
            generation, over_reasoning = self._reasoning_cut(episode, generation)
            self._take_generation(episode, generation, version, iteration)
            if over_reasoning:
                _finish(episode, "reasoning_budget")
            elif self._turn_complete(generation):
                self._end_turn(episode)
            elif len(generation.token_ids) >= cap:
                self._stop_at_cap(episode, reason)

    def _sampling_for(self, episode: Episode, cap: int) -> SamplingConfig:
        """The runner's sampling with this episode's token cap, temperature and seed."""
        update: dict[str, Any] = {"max_tokens": cap}
        if episode.temperature is not None:
            update["temperature"] = episode.temperature
        if episode.seed is not None:
            update["seed"] = episode_seed(episode.seed, len(episode.token_ids))
        return self.sampling.model_copy(update=update)

    def _generate(self, episodes: list[Episode], samplings: list[SamplingConfig]) -> list[Generation]:
        """One engine call for the batch (per-episode caps as per-prompt sampling params)."""
        prompts = [list(episode.token_ids) for episode in episodes]
        for episode in episodes:
            episode.context_peak = max(episode.context_peak, len(episode.token_ids))
        return [gens[0] for gens in self.engine.generate(prompts, samplings)]

    def _maybe_elide(self, episode: Episode) -> None:
        """At the start of a turn, a context over budget moves the episode to a new, elided window."""
        ctx = self.cfg.context
        if (
            not ctx.enabled
            or len(episode.token_ids) <= ctx.budget_tokens
            or len(episode.token_ids) != episode.turn_start
        ):
            return
        elided, turns = elide_messages(episode.messages, ctx.keep_last_turns, ctx.placeholder)
        if turns <= episode.elided_turns:
            return  # nothing new to elide: the context limit decides
        episode.windows.append(
            Window(
                episode.token_ids,
                episode.loss_mask,
                episode.logprobs,
                episode.versions,
                episode.routing,
                episode.segments,
                len(episode.messages),
            )
        )
        prompt = render_transcript_ids(self.tokenizer, elided, episode.tools).input_ids
        episode.token_ids, episode.loss_mask, episode.logprobs, episode.versions = [], [], [], []
        episode.routing, episode.segments, episode.elided_turns = None, [], turns
        _append(episode, prompt, written=False)
        episode.prompt_len = episode.turn_start = len(prompt)
        episode.in_think = self._opens_think(prompt)

    def _stop_at_cap(self, episode: Episode, reason: str) -> None:
        if reason == "paused":
            episode.status = "paused"
        else:
            _finish(episode, reason)  # type: ignore[arg-type]

    def _reasoning_cut(self, episode: Episode, generation: Generation) -> tuple[Generation, bool]:
        """Count the generation's reasoning tokens; when the episode's reasoning budget runs out inside it, the
        generation cut right after the last budgeted reasoning token, and True."""
        remaining = None
        if episode.max_reasoning_tokens is not None:
            remaining = episode.max_reasoning_tokens - episode.reasoning_tokens
        count, cut, episode.in_think = count_reasoning(
            generation.token_ids, episode.in_think, self.think_ids, remaining
        )
        episode.reasoning_tokens += count
        if cut is None:
            return generation, False
        start = len(episode.token_ids)
        routed = generation.routed_experts
        return replace(
            generation,
            token_ids=generation.token_ids[:cut],
            logprobs=generation.logprobs[:cut],
            routed_experts=None if routed is None else routed[: start + cut],
            finish_reason="length",
        ), True

    def _take_generation(self, episode: Episode, generation: Generation, version: int, iteration: int) -> None:
        start = len(episode.token_ids)
        logprobs = (
            generation.logprobs
            if len(generation.logprobs) == len(generation.token_ids)
            else [0.0] * len(generation.token_ids)
        )
        _append(episode, generation.token_ids, written=True, logprobs=logprobs, version=version)
        if generation.routed_experts is not None:
            episode.routing = merge_first(episode.routing, generation.routed_experts)
        episode.generated_tokens += len(generation.token_ids)
        if generation.token_ids:
            episode.segments.append(Segment(start, len(episode.token_ids), version, iteration))

    def _turn_complete(self, generation: Generation) -> bool:
        ids = generation.token_ids
        return generation.finish_reason == "stop" or bool(ids and ids[-1] in self.stop_ids)

    # --- ending a turn ---------------------------------------------------------------------

    def _end_turn(self, episode: Episode) -> None:
        """Parse the finished turn, run its calls, append the results (or end the episode)."""
        env = self.envs[episode.env_name]
        turn_ids = episode.token_ids[episode.turn_start :]
        known = [tool.name for tool in episode.tools] or None
        turn = parse_generation(self.tokenizer, Generation([], turn_ids), episode.call_index, known)
        episode.messages.append(turn.message)
        episode.turns += 1
        errors = [error for error in turn.parse_errors if error.kind not in SOFT_ERRORS]
        observations = parse_error_messages(errors, episode.call_index + len(turn.message.tool_calls))
        episode.errors.extend(error.message for error in errors)
        episode.call_index += len(turn.message.tool_calls) + len(errors)
        if not isinstance(env, MultiTurnEnvironment):
            done = True  # single-turn: the one answer ends the episode, tool-call junk or not
        elif turn.message.tool_calls or not errors:
            done = self._step_env(env, episode, turn.message, observations)
        else:
            done = False  # only malformed calls: the errors go back to the model, the env is not stepped
        if episode.status == "done":
            return
        if done:
            _finish(episode, "env_done")
        elif episode.turns >= self.cfg.max_turns:
            _finish(episode, "max_turns")
        else:
            self._append_observations(episode, observations)

    def _step_env(
        self, env: MultiTurnEnvironment, episode: Episode, message: Message, observations: list[Message]
    ) -> bool:
        """Run env.step on the turn; its observations go before the parse errors. Returns done."""
        episode.env_turns.append(message)
        try:
            result = env.step(episode.state, message)
        except Exception as err:  # a crashing environment ends this episode only
            log.warning("episode %s: %s.step raised %s", episode.id, env.name, err)
            _finish(episode, "env_error", f"step: {type(err).__name__}: {err}")
            return True
        observations[:0] = list(result.observations)
        return bool(result.done)

    def _append_observations(self, episode: Episode, observations: list[Message]) -> None:
        cut = [truncate_observation(self.tokenizer, m, self.cfg.max_observation_tokens) for m in observations]
        episode.messages.extend(cut)
        rendered = render_continuation_ids(self.tokenizer, cut, add_generation_prompt=True)
        _append(episode, rendered.input_ids, written=False)
        episode.turn_start = len(episode.token_ids)
        episode.in_think = self._opens_think(rendered.input_ids)

    def _opens_think(self, prompt_ids: Sequence[int]) -> bool:
        """Whether a prompt ends with `<think>` (the thinking format's generation prompt): the model's next tokens
        are reasoning."""
        return bool(prompt_ids) and prompt_ids[-1] == self.think_ids[0]


def score_episode(env: Environment, episode: Episode) -> Reward:
    """The episode's reward; a scorer that raises, or returns a value outside the env's reward_range, gives the
    env's minimum reward with the error. An infrastructure failure (`Reward.infra_failure`) is re-scored once."""
    reward = _score_once(env, episode)
    return _score_once(env, episode) if reward.infra_failure else reward


def _score_once(env: Environment, episode: Episode) -> Reward:
    method = "score_state" if isinstance(env, MultiTurnEnvironment) else "score"
    scorer = f"{type(env).__name__}.{method}"
    try:
        if isinstance(env, MultiTurnEnvironment):
            return check_reward(env.score_state(episode.task, episode.state), tuple(env.reward_range), scorer)
        final = episode.messages[-1].content if episode.messages and episode.messages[-1].role == "assistant" else ""
        return check_reward(env.score(episode.task, final), tuple(env.reward_range), scorer)
    except Exception as err:
        return Reward(value=env.reward_range[0], error=scorer_error_text(err, env, method))


def episode_tool_stats(episode: Episode) -> dict[str, int]:
    """Agentic counts of one episode: assistant `turns`, well-formed `tool_calls`, `malformed_calls` (the parser
    refused them; the env never saw them) and `tool_errors` (calls the env answered with an error)."""
    calls = sum(len(m.tool_calls) for m in episode.messages if m.role == "assistant")
    error_results = sum(1 for m in episode.messages if m.role == "tool" and m.content.startswith(ERROR_PREFIX))
    malformed = len(episode.errors)
    return {
        "turns": episode.turns,
        "tool_calls": calls,
        "malformed_calls": malformed,
        "tool_errors": max(0, error_results - malformed),
    }


def episode_context_stats(episode: Episode) -> dict[str, int]:
    """Long-episode counts: `windows` (1 + elisions), `elisions`, `context_peak` (longest context a generation saw,
    tokens) and `stored_tokens` (transcript tokens kept over all windows)."""
    windows = getattr(episode, "windows", [])
    return {
        "windows": len(windows) + 1,
        "elisions": len(windows),
        "context_peak": int(getattr(episode, "context_peak", 0)),
        "stored_tokens": sum(len(w.token_ids) for w in windows) + len(episode.token_ids),
    }
