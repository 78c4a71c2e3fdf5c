"""Domains of the data synthesis: tools + a rule-based simulator + task templates.

Built in: the tool_use gym's toolsets (bank, calendar, filesystem — reused as tool simulators,
their Scenarios carry rubrics and reference solutions) and the synthetic record-store domains of
`k2post.synth.record_store` (inventory, tickets, recipes; more from blueprints in the config).
A registry keyed by name; a duplicate name is an error.

    domains = build_domains(["bank", "inventory"], extra_blueprints=[])
    domain = domains["bank"]; state = domain.new_state(scenario); domain.toolset.call(state, ...)
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from k2post.toolsets import TEMPLATES_BY_TOOLSET, TOOLSETS, load_state
from k2post.toolsets.base import Toolset, ToolsetState
from k2post.toolsets.checks import Scenario
from k2post.chat.types import ToolSpec
from k2post.synth.record_store import (
    BLUEPRINTS,
    DomainBlueprint,
    RecordStoreState,
    RecordStoreToolset,
    record_templates,
)

TemplateFn = Callable[[random.Random], Scenario]


class DomainError(ValueError):
    """An unknown or duplicate domain."""


@dataclass(frozen=True)
class Domain:
    """A domain the synthesis can make tasks and trajectories for."""

    name: str
    description: str
    context: str
    toolset: Toolset
    templates: dict[str, TemplateFn]
    state_loader: Callable[[dict[str, Any]], ToolsetState]

    def tools(self) -> list[ToolSpec]:
        """The domain's tools (MCP-style JSON schemas)."""
        return self.toolset.tools()

    def new_state(self, scenario: Scenario) -> ToolsetState:
        """A fresh simulator state for a scenario."""
        return self.state_loader(scenario.initial_state)


def toolset_domain(name: str) -> Domain:
    """A domain over one of the tool_use gym's toolsets."""
    toolset = TOOLSETS[name]
    return Domain(name, toolset.description, toolset.context, toolset, dict(TEMPLATES_BY_TOOLSET[name]), load_state)


def blueprint_domain(bp: DomainBlueprint) -> Domain:
    """A synthetic record-store domain."""
    toolset = RecordStoreToolset(bp)
    return Domain(
        bp.domain, bp.description, toolset.context, toolset, record_templates(bp), RecordStoreState.model_validate
    )


def known_domain_names(extra: list[DomainBlueprint] | None = None) -> list[str]:
    """Every domain name buildable here (toolsets, built-in blueprints, `extra`)."""
    return list(TOOLSETS) + list(BLUEPRINTS) + [bp.domain for bp in extra or []]


def build_domains(names: list[str], extra_blueprints: list[DomainBlueprint] | None = None) -> dict[str, Domain]:
    """The named domains; DomainError for unknown or duplicate names."""
    extra = {bp.domain: bp for bp in extra_blueprints or []}
    clash = sorted(set(extra) & (set(TOOLSETS) | set(BLUEPRINTS)))
    if clash:
        raise DomainError(f"synthetic domain {clash[0]!r} is already a built-in domain: rename it")
    if len(set(names)) != len(names):
        raise DomainError(f"domain listed twice in {names}")
    domains = {}
    for name in names:
        if name in TOOLSETS:
            domains[name] = toolset_domain(name)
        elif name in BLUEPRINTS or name in extra:
            domains[name] = blueprint_domain(extra.get(name) or BLUEPRINTS[name])
        else:
            raise DomainError(f"unknown domain {name!r}; known: {', '.join(known_domain_names(list(extra.values())))}")
    return domains
