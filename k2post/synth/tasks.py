"""Agents, tasks with rubrics, and user personas of the data synthesis.

An `Agent` is a system prompt plus a toolset (one per domain). A `SynthTask` is a user goal in a
domain with a `Rubric` (success criteria on the final state, expected tool use, checkpoints, the
answer's required facts) and a reference solution, made from a domain's templates. Train / test
membership is `scenario_split` (the tool_use gym's rule), so held-out tasks stay held out.

    tasks = make_tasks(domain, split="train", n=50, seed=0, personas=PERSONAS)
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from k2post.toolsets.base import SYSTEM_PROMPT  # the gym's own prompt: SFT data matches what RL sees
from k2post.toolsets.checks import Checkpoint, Scenario, StateCheck, scenario_split
from k2post.chat.types import ToolSpec
from k2post.synth.domains import Domain


class Persona(BaseModel):
    """How a simulated user phrases a request and reacts."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Persona id.")
    opening: str = Field(description="Template of the first message; {request} is the task's request.")
    nudge: str = Field(description="What the user says when the assistant stops to ask instead of acting.")


PERSONAS: dict[str, Persona] = {
    p.name: p
    for p in (
        Persona(name="direct", opening="{request}", nudge="Yes, go ahead."),
        Persona(
            name="polite",
            opening="Hi! Could you help me with something? {request} Thank you!",
            nudge="Yes please, go ahead.",
        ),
        Persona(name="busy", opening="quick one: {request}", nudge="yes. just do it."),
        Persona(
            name="careful",
            opening="{request} Please double-check the result before you answer.",
            nudge="Yes, that's right, please continue.",
        ),
    )
}


@dataclass(frozen=True)
class Agent:
    """A system prompt plus the tools of a domain."""

    name: str
    system_prompt: str
    tools: list[ToolSpec]


def agent_for(domain: Domain) -> Agent:
    """The agent of a domain: the tool_use gym's system prompt over its toolset."""
    prompt = SYSTEM_PROMPT.format(what=domain.description, context=domain.context).strip()
    return Agent(name=f"{domain.name}_agent", system_prompt=prompt, tools=domain.tools())


class Rubric(BaseModel):
    """What a trajectory must achieve to be kept."""

    model_config = ConfigDict(extra="forbid")

    success_criteria: list[StateCheck] = Field(description="All must hold on the final simulator state.")
    expected_tools: list[str] = Field(description="Tools the solution needs; each must be called successfully.")
    checkpoints: list[Checkpoint] = Field(default_factory=list, description="Intermediate goals (calls, order).")
    answer: list[list[str]] = Field(
        default_factory=list, description="Groups of alternatives the final answer must mention."
    )

    def describe(self) -> list[str]:
        """The rubric as readable lines (for an LLM judge)."""
        lines = [f"final state: {c.description or c.path} ({c.op} {c.value!r})" for c in self.success_criteria]
        lines += [f"must call {name} successfully" for name in self.expected_tools]
        lines += [f"checkpoint {cp.id}: {cp.description or [c.tool for c in cp.calls]}" for cp in self.checkpoints]
        lines += [f"final answer mentions one of {group}" for group in self.answer]
        return lines


class SynthTask(BaseModel):
    """One task to synthesize a trajectory for."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="Stable id: domain, split, seed, index, template.")
    domain: str = Field(description="Domain name.")
    split: str = Field(description="train or test.")
    persona: str = Field(description="Persona of the simulated user.")
    scenario: Scenario = Field(description="Prompt, initial state, checks and reference solution.")
    rubric: Rubric = Field(description="What an accepted trajectory must achieve.")


def rubric_of(scenario: Scenario) -> Rubric:
    """A scenario's rubric: its success checks, checkpoints, answer, and the reference's tools."""
    tools = list(dict.fromkeys(call.name for turn in scenario.reference_turns for call in turn))
    return Rubric(
        success_criteria=scenario.success,
        expected_tools=tools,
        checkpoints=scenario.checkpoints,
        answer=scenario.answer,
    )


def make_task(
    domain: Domain, split: str, seed: int, index: int, personas: list[str], test_fraction: float
) -> SynthTask:
    """Task `index` of `split` for `seed`: the first generated scenario that falls in that split."""
    names = sorted(domain.templates)
    for attempt in range(10_000):
        rng = random.Random(f"synth:{domain.name}:{split}:{seed}:{index}:{attempt}")
        template = names[rng.randrange(len(names))]
        scenario = domain.templates[template](rng)
        if scenario_split(scenario, test_fraction) == split:
            persona = personas[rng.randrange(len(personas))]
            task_id = f"{domain.name}-{split}-{seed}-{index}-{template}"
            return SynthTask(
                id=task_id,
                domain=domain.name,
                split=split,
                persona=persona,
                scenario=scenario,
                rubric=rubric_of(scenario),
            )
    raise RuntimeError(f"no {split} task found for domain {domain.name} seed {seed} index {index}")


def make_tasks(
    domain: Domain, split: str, n: int, seed: int, personas: list[str], test_fraction: float = 0.1
) -> list[SynthTask]:
    """`n` deterministic tasks of a split."""
    return [make_task(domain, split, seed, index, personas, test_fraction) for index in range(n)]
