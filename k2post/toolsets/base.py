"""Stateful tool simulators: a JSON-able `ToolsetState` plus a `Toolset` that runs calls on it.

A toolset is core (no environment imports): the RL gym (`k2post_environments.tool_use`) and the SFT
data synthesis both drive it the same way.

    toolset = FileSystemToolset()
    state = FileSystemState(files={"a.txt": "hi"})
    toolset.tools()                                   # list[ToolSpec], MCP-style JSON schemas
    toolset.call(state, "read_file", {"path": "a.txt"})   # "hi"  (mutates `state` in place)
    toolset.call(state, "read_file", {})              # "Error: read_file: missing required ..."

`call` never raises on model input: unknown tools, schema violations and domain errors come
back as strings starting with `ERROR_PREFIX`. Randomness (transient failures, with probability
`state.failure_rate`, 0 by default) is drawn from a seeded RNG whose position is part of the
state, so replaying the same calls on the same state gives the same results.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from k2post.toolsets.schema import check_arguments, with_defaults
from k2post.chat.types import ToolSpec

ERROR_PREFIX = "Error: "
SYSTEM_PROMPT = (
    "You are an assistant that completes the user's request by calling the tools of {what}. "
    "Call tools as needed and read their results; when you are done, reply to the user in plain "
    "text without tool calls (that message ends the conversation). {context}"
)
"""The system prompt of a tool task (`what`, `context`: the toolset's): the tool_use gym and SFT synthesis
share it, so synthesized SFT data matches what RL shows the model."""


class ToolError(Exception):
    """A domain error inside a tool (no such file, insufficient funds, ...); becomes its result."""


class ToolsetState(BaseModel):
    """Base of every toolset's state: a seeded RNG position and the transient-failure rate."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    seed: int = Field(0, description="Seed of the state's RNG.")
    rng_draws: int = Field(0, ge=0, description="How many random numbers were drawn so far.")
    failure_rate: float = Field(0.0, ge=0.0, le=1.0, description="Probability that a valid call fails transiently.")

    def draw(self) -> float:
        """The next uniform [0, 1) number of the state's RNG (deterministic, advances it)."""
        value = random.Random(f"{self.seed}:{self.rng_draws}").random()
        self.rng_draws += 1
        return value


def is_error(result: str) -> bool:
    """Whether a tool result reports an error."""
    return result.startswith(ERROR_PREFIX)


def tool_spec(name: str, description: str, properties: dict[str, Any], required: list[str]) -> ToolSpec:
    """A ToolSpec whose parameters are a closed JSON-schema object."""
    parameters = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    return ToolSpec(name=name, description=description, parameters=parameters)


class Toolset:
    """Base of the simulators. Subclasses set `name`, `state_cls`, `specs` and define one
    method `tool_<name>(self, state, **arguments) -> str` per spec (raising ToolError)."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    context: ClassVar[str] = ""
    state_cls: ClassVar[type[ToolsetState]] = ToolsetState
    specs: ClassVar[tuple[ToolSpec, ...]] = ()

    def tools(self) -> list[ToolSpec]:
        """The tools of this toolset."""
        return list(self.specs)

    def output_schemas(self) -> dict[str, dict[str, Any]]:
        """Tool name -> declared MCP outputSchema (the spec-driven simulator's; built-in toolsets have none)."""
        return {}

    def tool_annotations(self) -> dict[str, dict[str, Any]]:
        """Tool name -> MCP annotations (readOnlyHint, ...), where a spec declared them."""
        return {}

    def tool_names(self) -> list[str]:
        """Names of the tools, in declaration order."""
        return [spec.name for spec in self.specs]

    def new_state(self, **fields: Any) -> ToolsetState:
        """A state of this toolset from keyword fields (validated)."""
        return self.state_cls.model_validate(fields)

    def canonical_arguments(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Arguments in a canonical form for logging and checkpoint matching (paths, times...)."""
        return dict(arguments)

    def call(self, state: ToolsetState, name: str, arguments: Any) -> str:
        """Run tool `name` on `state` (in place); errors come back as `Error: ...` strings."""
        spec = next((spec for spec in self.specs if spec.name == name), None)
        if spec is None:
            known = ", ".join(self.tool_names())
            return f"{ERROR_PREFIX}unknown tool {name!r} (available: {known})"
        problem = check_arguments(spec.parameters, arguments)
        if problem is not None:
            return f"{ERROR_PREFIX}{name}: {problem}"
        if state.failure_rate > 0 and state.draw() < state.failure_rate:
            return f"{ERROR_PREFIX}{name}: temporary failure (service unavailable), please retry"
        handler = getattr(self, f"tool_{name}")
        try:
            return handler(state, **with_defaults(spec.parameters, arguments))
        except ToolError as err:
            return f"{ERROR_PREFIX}{name}: {err}"
