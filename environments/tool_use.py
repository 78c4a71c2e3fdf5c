"""Multi-turn tool-use gym over stateful simulated toolsets (file system, calendar, bank).

Each task comes from a template of `k2post.toolsets` (deterministic per seed). Splits
(`k2post.envs.splits`): train, dev and test are disjoint by a hash of the task's content
(template, prompt, initial state: `scenario_split`, shared with SFT synthesis); dev and test
hold distinct scenarios. `shifted` draws unseen templates (`shifted_templates`, default: the
configured toolsets' templates left out of `templates`, else the other toolsets'), from the
test share of the hash only, so no config with these fractions ever trains on a shifted task.
`Task.answer` is the Scenario dump: initial
toolset state, success checks on the final state, checkpoints, expected answer substrings and a
reference solution. An episode:

    env = make_environment("tool_use", {"max_turns": 8})
    task = next(env.tasks("train", seed=0))
    state = env.reset(task)                          # ToolUseState (JSON-able pydantic model)
    result = env.step(state, assistant_message)      # runs its tool calls → tool messages
    reward = env.score_state(task, state)            # 0.6 state + 0.3 checkpoints + 0.1 answer

A read-only task (its success checks hold on the initial state: a look-up, "nothing changed") earns the state's
0.6 only when the answer states the value read and its checkpoints (the look-up calls) passed, so answering
"Done." without a call earns nothing; an answer that also names the other candidates (`Scenario.wrong_answers`)
is no answer.

`step` accepts a `Message` with `tool_calls`, a `Message`/str whose text holds K2 tool-call
tokens (parsed with `parse_assistant`), or an OpenAI-style dict. Malformed calls, unknown tools
and bad arguments come back as tool messages starting with `Error:`; nothing raises. The
episode ends on a turn without tool calls (the final answer) or after `max_turns` turns.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any, ClassVar

from pathlib import Path

from pydantic import BaseModel, Field, PrivateAttr, SerializeAsAny, field_validator, model_validator

from k2post.synth.domains import Domain, build_domains, known_domain_names, load_world
from k2post.synth.record_store import DomainBlueprint
from k2post.synth.specs import DomainSpec, load_tool_specs
from k2post.toolsets import TOOLSETS
from k2post.toolsets.base import ERROR_PREFIX, SYSTEM_PROMPT, ToolsetState, is_error
from k2post.toolsets.checks import (
    DEV_FRACTION,
    Scenario,
    ToolCallRecord,
    answer_ok,
    check_checkpoint,
    check_state,
    scenario_key,
    scenario_split,
)
from k2post.chat.parse import SOFT_ERRORS, ToolCallParseError, parse_assistant
from k2post.chat.tokens import TOOL_CALL_BEGIN, TOOL_CALLS_BEGIN
from k2post.chat.types import Message, ToolCall, ToolSpec, call_name, content_text, dump_json, format_call_id
from k2post.envs.base import EnvConfig, HonestPair, MultiTurnEnvironment, Play, Reward, Split, StepResult, Task
from k2post.envs.registry import register_environment
from k2post.envs.splits import SPLITS, check_split

ANSWER_PREVIEW_CHARS = 500


class ToolUseConfig(EnvConfig):
    """Config of the tool-use gym."""

    toolsets: list[str] = Field(
        default_factory=lambda: list(TOOLSETS),
        description="Toolsets (domains) to draw tasks from: built-in toolsets, the record-store domains (inventory, "
        "tickets, recipes, `synthetic_domains`) and the domains of `tool_specs` files.",
    )
    tool_specs: list[str] = Field(
        default_factory=list,
        description="MCP tool spec files (`tools/list` JSON) or directories whose domains `toolsets` may name; "
        "simulated from their schemas, with generated tasks (docs/SYNTH.md). Made absolute when the config loads.",
    )
    synthetic_domains: list[DomainBlueprint] = Field(
        default_factory=list, description="Extra record-store domains (as in `k2post synth`) `toolsets` may name."
    )
    templates: list[str] = Field(
        default_factory=list,
        description="Only these templates (empty: every template of `toolsets`).",
    )
    max_turns: int = Field(8, ge=1, description="Assistant turns before the episode is cut off.")
    max_calls_per_turn: int = Field(16, ge=1, description="Tool calls executed per turn; more get an error.")
    failure_rate: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Probability that a valid tool call fails transiently (seeded).",
    )
    success_weight: float = Field(0.6, ge=0.0, description="Weight of the success checks on the final state.")
    checkpoint_weight: float = Field(0.3, ge=0.0, description="Weight of the fraction of checkpoints passed.")
    answer_weight: float = Field(0.1, ge=0.0, description="Weight of the final-answer check.")
    test_fraction: float = Field(0.1, gt=0.0, lt=1.0, description="Share of the task space held out as test.")
    dev_fraction: float = Field(DEV_FRACTION, gt=0.0, lt=1.0, description="Share of the task space held out as dev.")
    train_size: int = Field(5000, ge=1, description="Tasks of the train split when `n` is not given.")
    test_size: int = Field(200, ge=1, description="Tasks of the test split when `n` is not given.")
    dev_size: int = Field(200, ge=1, description="Tasks of the dev split when `n` is not given.")
    shifted_size: int = Field(200, ge=1, description="Tasks of the shifted split when `n` is not given.")
    shifted_templates: list[str] | None = Field(
        None,
        description="Unseen templates of the shifted split (null: the templates of `toolsets` left "
        "out of `templates`, else those of the other toolsets); none may be a trained one.",
    )

    _domains: dict[str, Domain] | None = PrivateAttr(None)

    @field_validator("tool_specs")
    @classmethod
    def _absolute(cls, paths: list[str]) -> list[str]:
        return [str(Path(path).expanduser().absolute()) for path in paths]

    def spec_domains(self) -> list[DomainSpec]:
        """The domains of `tool_specs` (ValueError naming the bad file)."""
        return load_tool_specs(list(self.tool_specs)) if self.tool_specs else []

    def domains(self) -> dict[str, Domain]:
        """The configured toolsets, then every other built-in toolset (shifted tasks may use those)."""
        if self._domains is None:
            names = list(self.toolsets) + [name for name in TOOLSETS if name not in self.toolsets]
            self._domains = build_domains(names, self.synthetic_domains, self.spec_domains())
        return self._domains

    @model_validator(mode="after")
    def _check(self) -> ToolUseConfig:
        known = known_domain_names(self.synthetic_domains, self.spec_domains())
        unknown = sorted(set(self.toolsets) - set(known))
        if unknown:
            raise ValueError(f"unknown toolsets {unknown}; known: {known} (a tool spec file in `tool_specs` adds one)")
        if not self.toolsets:
            raise ValueError("toolsets must not be empty")
        domains = self.domains()
        every = {name for domain in domains.values() for name in domain.templates}
        allowed = {name for toolset in self.toolsets for name in domains[toolset].templates}
        if set(self.templates) - every:
            raise ValueError(f"unknown templates {sorted(set(self.templates) - every)}; known: {sorted(every)}")
        if self.success_weight + self.checkpoint_weight + self.answer_weight <= 0:
            raise ValueError("the reward weights must not all be 0")
        if self.templates and not set(self.templates) <= allowed:
            raise ValueError(f"templates {sorted(set(self.templates) - allowed)} are not in toolsets {self.toolsets}")
        if self.test_fraction + self.dev_fraction >= 1.0:
            raise ValueError("test_fraction + dev_fraction must be below 1 (train needs the rest)")
        return self._check_shift(allowed, every)

    def _check_shift(self, allowed: set[str], every: set[str]) -> ToolUseConfig:
        """Shifted templates must be known and never trained on."""
        if self.shifted_templates is None:
            return self
        trained = set(self.templates or allowed)
        unknown = sorted(set(self.shifted_templates) - every)
        seen = sorted(set(self.shifted_templates) & trained)
        if unknown or seen or not self.shifted_templates:
            raise ValueError(
                f"shifted_templates must be known templates that are not trained on: unknown {unknown}, trained {seen}"
            )
        return self


class ToolUseState(BaseModel):
    """One episode: the toolset state, the call log and turn bookkeeping (JSON round-trips)."""

    task_id: str = Field(description="Id of the task being played.")
    world: SerializeAsAny[ToolsetState] = Field(description="The toolset state the calls act on.")
    calls: list[ToolCallRecord] = Field(default_factory=list, description="Every call, in order.")
    errors: list[str] = Field(default_factory=list, description="Malformed-call messages, in order.")
    turns: int = Field(0, description="Assistant turns taken.")
    max_turns: int = Field(8, description="Turn limit.")
    next_call_index: int = Field(0, description="Dialogue-wide index of the next call id.")
    done: bool = Field(False, description="The episode is over.")
    truncated: bool = Field(False, description="It ended by hitting max_turns.")
    final_answer: str = Field("", description="Text of the last assistant turn.")

    @field_validator("world", mode="before")
    @classmethod
    def _load_world(cls, value: Any) -> Any:
        """A dumped world becomes its domain's state class (built-in toolset, spec domain, record store)."""
        return load_world(value) if isinstance(value, dict) else value


def episode_context(task: Task, episode: ToolUseState) -> str:
    """What the episode showed the model: the prompt's texts and every tool result (where an answer's numbers may
    come from)."""
    prompt = [message.content for message in task.messages if isinstance(message.content, str)]
    return "\n".join([*prompt, *(call.result for call in episode.calls)])


def _has_call_tokens(text: str) -> bool:
    return TOOL_CALLS_BEGIN in text or TOOL_CALL_BEGIN in text


def _error_message(call_id: str, text: str) -> Message:
    return Message(role="tool", tool_call_id=call_id, content=text, name=call_name(call_id))


def _parse_error_messages(errors: list[ToolCallParseError], first_index: int) -> list[Message]:
    """Tool messages for parse errors; turn-level ones get a `functions.invalid:IDX` id."""
    messages = []
    for offset, error in enumerate(errors):
        message = error.to_tool_message()
        if message is None:
            message = _error_message(format_call_id("invalid", first_index + offset), f"{ERROR_PREFIX}{error.message}")
        messages.append(message)
    return messages


def _read_call(raw: Any, call_id: str, offset: int) -> ToolCall | Message:
    """One OpenAI-style tool call, or the error tool message saying why it is unreadable."""
    try:
        return ToolCall.from_openai(raw, default_id=call_id)
    except KeyError as err:
        detail = f"missing field {err}"
    except (TypeError, ValueError, AttributeError) as err:  # ValidationError is a ValueError
        detail = f"{type(err).__name__}: {err}"
    return _error_message(call_id, f"{ERROR_PREFIX}tool call {offset}: unreadable call ({detail})")


def _calls_from_dict(data: dict[str, Any], first_index: int) -> tuple[list[ToolCall], list[Message]]:
    """Calls of an OpenAI-style message dict; unreadable ones become error messages."""
    calls: list[ToolCall] = []
    errors: list[Message] = []
    raw_calls = data.get("tool_calls")
    for offset, raw in enumerate(raw_calls if isinstance(raw_calls, list) else [raw_calls]):
        raw_id = raw.get("id") if isinstance(raw, dict) else None
        fallback = format_call_id("invalid", first_index + offset)
        read = _read_call(raw, raw_id if isinstance(raw_id, str) and raw_id else fallback, offset)
        if isinstance(read, ToolCall):
            calls.append(read)
        else:
            errors.append(read)
    return calls, errors


def _text_of(content: Any) -> str:
    """Plain text of OpenAI-style content (string or parts); anything else is empty."""
    try:
        return content_text(content)
    except (AttributeError, TypeError):
        return ""


def _parse_text(text: str, first_index: int) -> tuple[str, list[ToolCall], list[Message]]:
    """Parse raw K2 assistant text; an unclosed <think> alone is not a tool-call error."""
    parsed = parse_assistant(text, start_index=first_index)
    errors = [error for error in parsed.errors if error.kind not in SOFT_ERRORS]
    first_error_index = first_index + len(parsed.tool_calls)
    return parsed.content, parsed.tool_calls, _parse_error_messages(errors, first_error_index)


def _split_turn(
    assistant: Message | str | dict[str, Any], first_index: int
) -> tuple[str, list[ToolCall], list[Message]]:
    """(final text, well-formed calls, error tool messages) of one assistant turn."""
    if isinstance(assistant, Message):
        if assistant.tool_calls or not _has_call_tokens(assistant.content):
            return assistant.content, list(assistant.tool_calls), []
        return _parse_text(assistant.content, first_index)
    if isinstance(assistant, dict):
        content = _text_of(assistant.get("content"))
        if not assistant.get("tool_calls"):
            return _parse_text(content, first_index) if _has_call_tokens(content) else (content, [], [])
        calls, errors = _calls_from_dict(assistant, first_index)
        return content, calls, errors
    return _parse_text(assistant if isinstance(assistant, str) else "", first_index)


def slip_value(value: Any) -> Any:
    """A near miss of a tool argument: a number one up, a text with " 2" added (anything else as is)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return value
    return value + 1 if isinstance(value, (int, float)) else f"{value} 2"


def slip_answer(scenario: Scenario) -> str:
    """The reference answer with each expected value swapped for a wrong one: another candidate
    (`wrong_answers`), else the value with its last digit one up, else reversed."""
    text = scenario.reference_answer
    for group in scenario.answer:
        for alternative in sorted(group, key=len, reverse=True):
            if alternative in text:
                text = text.replace(alternative, _wrong_value(alternative, scenario.wrong_answers))
    return text


def _wrong_value(value: str, others: list[str]) -> str:
    if others:
        return others[0]
    digits = [i for i, ch in enumerate(value) if ch.isdigit()]
    if digits:
        i = digits[-1]
        return f"{value[:i]}{(int(value[i]) + 1) % 10}{value[i + 1 :]}"
    return value[::-1] if value[::-1] != value else f"{value}x"


def _calls_as_messages(turns: list[list[tuple[str, dict[str, Any]]]]) -> list[Message]:
    """Assistant turns holding the given (tool, arguments) calls, ids numbered through the dialogue."""
    messages, index = [], 0
    for turn in turns:
        calls = [
            ToolCall(id=format_call_id(name, index + k), name=name, arguments=args)
            for k, (name, args) in enumerate(turn)
        ]
        messages.append(Message(role="assistant", content="", tool_calls=calls))
        index += len(turn)
    return messages


def read_done(checkpoints: dict[str, float], episode: ToolUseState) -> bool:
    """The reading a read-only task needs happened: every checkpoint passed (a task without any: one successful
    call)."""
    return all(checkpoints.values()) if checkpoints else any(call.ok for call in episode.calls)


@register_environment
class ToolUseEnv(MultiTurnEnvironment):
    """Stateful tool use: file system, calendar and bank tasks scored on the final state."""

    name: ClassVar[str] = "tool_use"
    task_type: ClassVar[str] = "tool_use"
    config_cls: ClassVar[type[EnvConfig]] = ToolUseConfig
    max_turns: ClassVar[int] = 8
    config: ToolUseConfig

    # --- tasks ---------------------------------------------------------------------------

    def domain(self, name: str) -> Domain:
        """A configured toolset's domain (simulator, templates, state loader)."""
        return self.config.domains()[name]

    def _template(self, name: str) -> Any:
        return next(d.templates[name] for d in self.config.domains().values() if name in d.templates)

    def template_names(self) -> list[str]:
        """The templates tasks are drawn from."""
        names = [name for toolset in self.config.toolsets for name in self.domain(toolset).templates]
        return [name for name in names if not self.config.templates or name in self.config.templates]

    def tools(self) -> list[ToolSpec]:
        """Every tool of the configured toolsets (a task uses those of its own toolset)."""
        return [spec for toolset in self.config.toolsets for spec in self.domain(toolset).tools()]

    def tools_for(self, task: Task) -> list[ToolSpec]:
        """The tools of the task's toolset."""
        return self.domain(Scenario.model_validate(task.answer).toolset).tools()

    def shifted_template_names(self) -> list[str]:
        """The unseen templates shifted tasks are drawn from (see `shifted_templates`)."""
        if self.config.shifted_templates is not None:
            return list(self.config.shifted_templates)
        trained = set(self.template_names())
        same = [n for ts in self.config.toolsets for n in self.domain(ts).templates if n not in trained]
        other = [n for ts in TOOLSETS if ts not in self.config.toolsets for n in self.domain(ts).templates]
        if not (same or other):
            raise ValueError(
                "tool_use: split 'shifted' has no unseen template (every template is trained on): "
                "set shifted_templates or restrict toolsets/templates"
            )
        return same or other

    def split_of(self, scenario: Scenario) -> Split:
        """Which split a scenario belongs to: a hash of its prompt and initial state."""
        return scenario_split(scenario, self.config.test_fraction, self.config.dev_fraction)

    def draw(self, split: Split, seed: int, index: int, skip: set[str] | None = None) -> tuple[str, Scenario]:
        """(task id, scenario) of task `index` of a split for `seed`: the first generated scenario
        of that split (shifted: of an unseen template, in the test share) whose content
        (`scenario_key`) is not in `skip`."""
        names = self.shifted_template_names() if split == "shifted" else self.template_names()
        bucket = "test" if split == "shifted" else split
        for attempt in range(10_000):
            rng = random.Random(f"tool_use:{split}:{seed}:{index}:{attempt}")
            template = names[rng.randrange(len(names))]
            scenario = self._template(template)(rng)
            if self.split_of(scenario) == bucket and (skip is None or scenario_key(scenario) not in skip):
                return f"{split}-{seed}-{index}-{template}", scenario
        raise RuntimeError(f"tool_use: no new {split} task found for seed {seed} index {index}")

    def make_task(self, split: Split, seed: int, index: int) -> Task:
        """Task `index` of a split for `seed` (see `draw`)."""
        return self._task(*self.draw(split, seed, index))

    def _task(self, task_id: str, scenario: Scenario) -> Task:
        toolset = self.domain(scenario.toolset).toolset
        system = SYSTEM_PROMPT.format(what=toolset.description, context=toolset.context).strip()
        return Task(
            id=task_id,
            env=self.name,
            task_type=self.task_type,
            messages=[
                Message(role="system", content=system),
                Message(role="user", content=scenario.prompt),
            ],
            answer=scenario.model_dump(mode="json"),
            metadata={
                "toolset": scenario.toolset,
                "template": scenario.template,
                "tools": [spec.to_openai() for spec in toolset.tools()],
            },
        )

    def tasks(self, split: Split = "train", seed: int = 0, n: int | None = None) -> Iterator[Task]:
        """Tasks of a split, deterministic per seed; `n` defaults to the split's `*_size`; the
        held-out splits (dev, test, shifted) never repeat a scenario."""
        check_split(self.name, split, SPLITS)
        count = n if n is not None else getattr(self.config, f"{split}_size")
        seen: set[str] | None = None if split == "train" else set()
        for index in range(count):
            task_id, scenario = self.draw(split, seed, index, seen)
            if seen is not None:
                seen.add(scenario_key(scenario))
            yield self._task(task_id, scenario)

    # --- episodes --------------------------------------------------------------------------

    def reset(self, task: Task) -> ToolUseState:
        """A fresh episode on the task's initial toolset state."""
        scenario = Scenario.model_validate(task.answer)
        world = self.domain(scenario.toolset).state_loader(scenario.initial_state)
        if self.config.failure_rate > 0:
            world.failure_rate = self.config.failure_rate
        return ToolUseState(task_id=task.id, world=world, max_turns=self.config.max_turns)

    def _execute(self, state: ToolUseState, call: ToolCall) -> str:
        """Run one call on the world and log it; never raises."""
        toolset = self.domain(state.world.toolset).toolset
        try:
            result = toolset.call(state.world, call.name, call.arguments)
            arguments = toolset.canonical_arguments(call.name, call.arguments)
        except Exception as err:  # a simulator bug must not kill a rollout
            result, arguments = (
                f"{ERROR_PREFIX}{call.name}: internal error ({type(err).__name__}: {err})",
                dict(call.arguments),
            )
        record = ToolCallRecord(
            turn=state.turns,
            id=call.id,
            name=call.name,
            arguments=arguments,
            result=result,
            ok=not is_error(result),
        )
        state.calls.append(record)
        return result

    def _run_calls(self, state: ToolUseState, calls: list[ToolCall]) -> list[Message]:
        """Execute the turn's calls (up to max_calls_per_turn) → tool messages."""
        messages = []
        for offset, call in enumerate(calls):
            call_id = call.id or format_call_id(call.name, state.next_call_index + offset)
            if offset >= self.config.max_calls_per_turn:
                limit = self.config.max_calls_per_turn
                result = f"{ERROR_PREFIX}{call.name}: not run, at most {limit} tool calls per turn"
                state.errors.append(result)
            else:
                result = self._execute(state, call.model_copy(update={"id": call_id}))
            messages.append(Message(role="tool", tool_call_id=call_id, content=result, name=call.name))
        return messages

    def step(self, state: ToolUseState, assistant: Message | str | dict[str, Any]) -> StepResult:
        """Run one assistant turn's tool calls; done on a turn without calls or at max_turns."""
        if state.done:
            return StepResult(observations=[], done=True)
        content, calls, error_messages = _split_turn(assistant, state.next_call_index)
        observations = self._run_calls(state, calls) + error_messages
        state.errors.extend(message.content for message in error_messages)
        state.next_call_index += len(calls) + len(error_messages)
        state.turns += 1
        state.final_answer = content.strip()
        if not observations:
            state.done = True
        elif state.turns >= state.max_turns:
            state.done = state.truncated = True
        return StepResult(observations=observations, done=state.done)

    # --- honest and cheap plays (the adversarial suite) -------------------------------------

    def honest(self, task: Task) -> HonestPair:
        """Right: the reference calls and answer. Wrong: the same calls with a wrong final answer (`slip_answer`),
        or, for a task whose answer is not checked, the last call with its arguments one off (`slip_value`)."""
        scenario = Scenario.model_validate(task.answer)
        turns = [[(call.name, call.arguments) for call in turn] for turn in scenario.reference_turns]
        right = _calls_as_messages(turns) + [Message(role="assistant", content=scenario.reference_answer)]
        if scenario.answer:
            wrong_text = slip_answer(scenario)
        else:
            wrong_text = scenario.reference_answer
            if turns and turns[-1]:
                name, args = turns[-1][-1]
                turns[-1] = [*turns[-1][:-1], (name, {key: slip_value(value) for key, value in args.items()})]
        return HonestPair(
            right=right, wrong=_calls_as_messages(turns) + [Message(role="assistant", content=wrong_text)]
        )

    def hacks(self, task: Task) -> dict[str, Play]:
        """The reference calls answered with every candidate; the reference answer without reading."""
        scenario = Scenario.model_validate(task.answer)
        turns = [[(call.name, call.arguments) for call in turn] for turn in scenario.reference_turns]
        plays: dict[str, Play] = {"answer_unread": [Message(role="assistant", content=scenario.reference_answer)]}
        if scenario.wrong_answers:
            every = f"{scenario.reference_answer} Or: {', '.join(scenario.wrong_answers)}."
            plays["every_candidate"] = _calls_as_messages(turns) + [Message(role="assistant", content=every)]
        return plays

    # --- scoring ---------------------------------------------------------------------------

    def score_state(self, task: Task, state: ToolUseState | dict[str, Any]) -> Reward:
        """Weighted success on the final state, checkpoints passed and the final-answer check."""
        scenario = Scenario.model_validate(task.answer)
        episode = state if isinstance(state, ToolUseState) else ToolUseState.model_validate(state)
        world = episode.world.model_dump(mode="json")
        failed = [
            check.description or dump_json(check.path) for check in scenario.success if not check_state(check, world)
        ]
        checkpoints = {cp.id: float(check_checkpoint(cp, episode.calls, world)) for cp in scenario.checkpoints}
        answer = self._answer_ok(scenario, episode, succeeded=not failed, context=episode_context(task, episode))
        read_only = self.read_only(scenario)
        if read_only and not failed and not (answer and read_done(checkpoints, episode)):
            failed = ["read-only task: the answer must state the value read (read with the tools)"]
        parts = [
            (self.config.success_weight, 0.0 if failed else 1.0),
            (self.config.answer_weight, answer),
        ]
        if checkpoints:
            parts.append((self.config.checkpoint_weight, sum(checkpoints.values()) / len(checkpoints)))
        total = sum(weight for weight, _ in parts)
        value = sum(weight * part for weight, part in parts) / total if total > 0 else 0.0
        breakdown = {"final_state": 0.0 if failed else 1.0, **checkpoints, "answer": answer}
        info = {**self._info(episode, failed), "read_only": read_only}
        return Reward(value=min(1.0, max(0.0, value)), breakdown=breakdown, info=info)

    def read_only(self, scenario: Scenario) -> bool:
        """A task whose success checks already hold on its initial state (a look-up: "nothing changed"): doing
        nothing passes them, so its final state counts only with the fact read (`score_state`)."""
        initial = self.domain(scenario.toolset).state_loader(scenario.initial_state).model_dump(mode="json")
        return all(check_state(check, initial) for check in scenario.success)

    @staticmethod
    def _answer_ok(scenario: Scenario, episode: ToolUseState, succeeded: bool, context: str) -> float:
        """Expected substrings in the final answer (and no second candidate number: `answer_ok`); a task without
        any needs a closing message after a successful final state (so doing nothing earns nothing)."""
        if scenario.answer:
            return float(answer_ok(scenario, episode.final_answer, context))
        closed = bool(episode.final_answer) and episode.done and not episode.truncated
        return float(closed and succeeded)

    @staticmethod
    def _info(episode: ToolUseState, failed: list[str]) -> dict[str, Any]:
        return {
            "failed_success_checks": failed,
            "turns": episode.turns,
            "tool_calls": len(episode.calls),
            "tool_errors": sum(not call.ok for call in episode.calls) + len(episode.errors),
            "truncated": episode.truncated,
            "final_answer": episode.final_answer[:ANSWER_PREVIEW_CHARS],
        }


__all__ = ["ToolUseConfig", "ToolUseEnv", "ToolUseState"]
