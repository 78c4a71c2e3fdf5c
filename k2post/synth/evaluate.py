"""Evaluate a model on held-out synthesized tasks: does it emit well-formed tool calls, does it solve them?

`SynthTaskEnv` turns synthesis tasks into a multi-turn `Environment` (the domain's rule-based
simulator answers calls; the `RubricJudge` decides success), so the real rollout machinery
(`k2post.rollout.agentic.AgenticRollout` over a `RolloutEngine`) plays them:

    report = evaluate_tasks(engine, read_heldout("runs/synth/heldout_tasks.jsonl"))
    report["well_formed_call_rate"], report["solve_rate"]

- well-formed call rate: of the assistant turns that contain tool-call tokens, the share that parse
  with no error (K2 parser);
- call rate: the share of episodes with at least one well-formed call;
- solve rate: the share of tasks whose rubric is met (final state, expected tools, checkpoints,
  answer; same judge as the synthesis).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from k2post.toolsets.base import is_error
from k2post.toolsets.checks import ToolCallRecord
from k2post.chat.tokens import TOOL_CALL_BEGIN, TOOL_CALLS_BEGIN
from k2post.chat.types import Message, ToolSpec
from k2post.envs.base import MultiTurnEnvironment, Reward, Split, StepResult, Task
from k2post.synth.domains import Domain, build_domains
from k2post.synth.judge import RubricJudge
from k2post.synth.tasks import PERSONAS, SynthTask, agent_for
from k2post.synth.trajectory import Trajectory


class SynthTaskEnv(MultiTurnEnvironment):
    """Synthesis tasks as a multi-turn environment (not registered: built from a task list)."""

    name: ClassVar[str] = "synth_tasks"
    task_type: ClassVar[str] = "tool_use"

    def __init__(self, tasks: list[SynthTask], domains: dict[str, Domain] | None = None):
        super().__init__()
        self.synth = {task.id: task for task in tasks}
        self.domains = domains or build_domains(sorted({task.domain for task in tasks}))

    def as_task(self, task: SynthTask) -> Task:
        domain = self.domains[task.domain]
        opening = PERSONAS[task.persona].opening.format(request=task.scenario.prompt)
        messages = [
            Message(role="system", content=agent_for(domain).system_prompt),
            Message(role="user", content=opening),
        ]
        return Task(
            id=task.id, env=self.name, task_type=self.task_type, messages=messages, metadata={"domain": task.domain}
        )

    def tasks(self, split: Split = "train", seed: int = 0, n: int | None = None) -> Iterator[Task]:
        chosen = [t for t in self.synth.values() if t.split == split]
        yield from (self.as_task(t) for t in chosen[: n if n is not None else len(chosen)])

    def tools_for(self, task: Task) -> list[ToolSpec]:
        return self.domains[self.synth[task.id].domain].tools()

    def reset(self, task: Task) -> dict[str, Any]:
        synth = self.synth[task.id]
        return {
            "state": self.domains[synth.domain].new_state(synth.scenario),
            "calls": [],
            "turns": 0,
            "answer": "",
            "done": False,
        }

    def step(self, state: dict[str, Any], assistant: Message) -> StepResult:
        state["turns"] += 1
        if not assistant.tool_calls:
            state["answer"], state["done"] = assistant.content, True
            return StepResult(observations=[], done=True)
        toolset = self.domains[state["state"].toolset].toolset
        observations = []
        for call in assistant.tool_calls:
            result = toolset.call(state["state"], call.name, dict(call.arguments))
            state["calls"].append(
                ToolCallRecord(
                    turn=state["turns"] - 1,
                    id=call.id,
                    name=call.name,
                    arguments=dict(call.arguments),
                    result=result,
                    ok=not is_error(result),
                )
            )
            observations.append(Message(role="tool", tool_call_id=call.id, content=result, name=call.name))
        return StepResult(observations=observations, done=False)

    def score_state(self, task: Task, state: dict[str, Any]) -> Reward:
        final = Message(role="assistant", content=state["answer"])
        trajectory = Trajectory(messages=[final], calls=state["calls"], turns=state["turns"], finished=state["done"])
        verdict = RubricJudge().judge(self.synth[task.id], trajectory, state["state"].model_dump(mode="json"))
        return Reward(value=1.0 if verdict.accepted else 0.0, breakdown={}, info={"reasons": verdict.reasons})

    def score(self, task: Task, response: str) -> Reward:
        state = self.reset(task)
        self.step(state, Message(role="assistant", content=response))
        return self.score_state(task, state)


def model_turns(episode, tokenizer) -> list[str]:
    """Decoded text (special tokens kept) of each model-written run of tokens (one per turn)."""
    runs, current = [], []
    for token, written in zip(episode.token_ids, episode.loss_mask):
        if written:
            current.append(token)
        elif current:
            runs, current = runs + [current], []
    runs += [current] if current else []
    return [tokenizer.decode(run, skip_special_tokens=False) for run in runs]


def call_turn_stats(episode, tokenizer) -> tuple[int, int, int]:
    """(turns with tool-call tokens, of those parsed without error, well-formed calls) of one episode."""
    from k2post.chat.parse import SOFT_ERRORS, parse_assistant

    with_tokens = well_formed = calls = 0
    for text in model_turns(episode, tokenizer):
        parsed = parse_assistant(text)
        if TOOL_CALLS_BEGIN in text or TOOL_CALL_BEGIN in text:
            with_tokens += 1
            well_formed += bool(parsed.tool_calls) and not [e for e in parsed.errors if e.kind not in SOFT_ERRORS]
        calls += len(parsed.tool_calls)
    return with_tokens, well_formed, calls


def evaluate_tasks(
    engine,
    tasks: list[SynthTask],
    max_turns: int = 8,
    max_turn_tokens: int = 160,
    domains: dict[str, Domain] | None = None,
) -> dict[str, Any]:
    """Play every task greedily with `engine`; tool-call and solve rates. `domains`: the tasks' domains
    (needed for spec and custom record-store domains: `SynthConfig.build_domains()`)."""
    from k2post.rollout.agentic import AgenticRollout, score_episode
    from k2post.rollout.config import AgenticRolloutConfig, SamplingConfig

    env = SynthTaskEnv(tasks, domains)
    cfg = AgenticRolloutConfig(
        max_turns=max_turns, max_turn_tokens=max_turn_tokens, max_episode_tokens=max_turn_tokens * max_turns
    )
    runner = AgenticRollout(
        engine, {"synth_tasks": env}, cfg, SamplingConfig(temperature=0.0, max_tokens=max_turn_tokens)
    )
    episodes = [runner.start("synth_tasks", env.as_task(t)) for t in tasks]
    runner.run_iteration(episodes)
    stats = [call_turn_stats(e, engine.tokenizer) for e in episodes]
    solved = [score_episode(env, e).value == 1.0 for e in episodes]
    with_tokens, well_formed = sum(s[0] for s in stats), sum(s[1] for s in stats)
    return {
        "tasks": len(tasks),
        "solve_rate": sum(solved) / max(1, len(tasks)),
        "well_formed_call_rate": well_formed / with_tokens if with_tokens else 0.0,
        "call_rate": sum(s[2] > 0 for s in stats) / max(1, len(tasks)),
        "turns_with_call_tokens": with_tokens,
        "finish_reasons": {
            r: sum(e.finish_reason == r for e in episodes) for r in sorted({e.finish_reason for e in episodes})
        },
        "solved": [t.id for t, ok in zip(tasks, solved) if ok],
    }
