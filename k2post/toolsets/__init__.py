"""Stateful simulated toolsets (file system, calendar, bank, calculator) and their task templates.

Independent of any environment class: `k2post_environments.tool_use` runs them as an RL gym, SFT
data synthesis can run them as tool simulators (each Scenario carries a reference solution).

    toolset = get_toolset("bank")
    scenario = TEMPLATES["bank_sweep"](random.Random(0))       # a Scenario
    state = load_state(scenario.initial_state)                 # a BankState
    toolset.call(state, "get_balance", {"account": "checking"})
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import Field, TypeAdapter

from k2post.toolsets import bank, calculator, calendar, filesystem
from k2post.toolsets.bank import BankState, BankToolset
from k2post.toolsets.base import ERROR_PREFIX, ToolError, Toolset, ToolsetState, is_error
from k2post.toolsets.calculator import CalculatorState, CalculatorToolset
from k2post.toolsets.calendar import CalendarState, CalendarToolset
from k2post.toolsets.checks import Scenario
from k2post.toolsets.filesystem import FileSystemState, FileSystemToolset

AnyToolsetState = Annotated[
    FileSystemState | CalendarState | BankState | CalculatorState,
    Field(discriminator="toolset"),
]
"""Any toolset's state; the `toolset` field picks the class when validating a dump."""

TOOLSETS: dict[str, Toolset] = {
    toolset.name: toolset for toolset in (FileSystemToolset(), CalendarToolset(), BankToolset(), CalculatorToolset())
}

TemplateFn = Callable[[random.Random], Scenario]
TEMPLATES_BY_TOOLSET: dict[str, dict[str, TemplateFn]] = {
    "filesystem": filesystem.TEMPLATES,
    "calendar": calendar.TEMPLATES,
    "bank": bank.TEMPLATES,
    "calculator": calculator.TEMPLATES,
}
TEMPLATES: dict[str, TemplateFn] = {
    name: template for templates in TEMPLATES_BY_TOOLSET.values() for name, template in templates.items()
}
"""Template name → function making a Scenario from an RNG (deterministic given its state)."""

_STATE_ADAPTER: TypeAdapter[Any] = TypeAdapter(AnyToolsetState)


def get_toolset(name: str) -> Toolset:
    """The toolset registered as `name`."""
    if name not in TOOLSETS:
        raise KeyError(f"unknown toolset {name!r} (known: {', '.join(TOOLSETS)})")
    return TOOLSETS[name]


def load_state(data: dict[str, Any] | ToolsetState) -> ToolsetState:
    """A fresh (deep-copied) toolset state from its dump; the `toolset` key picks the class."""
    if isinstance(data, ToolsetState):
        return data.model_copy(deep=True)
    return _STATE_ADAPTER.validate_python(data)


def templates_of(toolset: str) -> dict[str, TemplateFn]:
    """The templates whose scenarios use `toolset`."""
    get_toolset(toolset)
    return dict(TEMPLATES_BY_TOOLSET[toolset])


__all__ = [
    "ERROR_PREFIX",
    "TEMPLATES",
    "TEMPLATES_BY_TOOLSET",
    "TOOLSETS",
    "AnyToolsetState",
    "BankState",
    "BankToolset",
    "CalculatorState",
    "CalculatorToolset",
    "CalendarState",
    "CalendarToolset",
    "FileSystemState",
    "FileSystemToolset",
    "Scenario",
    "ToolError",
    "Toolset",
    "ToolsetState",
    "get_toolset",
    "is_error",
    "load_state",
    "templates_of",
]
