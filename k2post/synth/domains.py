"""Domains of the data synthesis: tools + a rule-based simulator + task templates.

Built in: the tool_use gym's toolsets (bank, calendar, filesystem — reused as tool simulators,
their Scenarios carry rubrics and reference solutions) and the synthetic record-store domains of
`k2post.synth.record_store` (inventory, tickets, recipes; more from blueprints in the config).
Any MCP tool spec file makes one more (`spec_domain`: the schema-driven `SpecToolset` and the
templates of `k2post.toolsets.spec_templates`). A registry keyed by name; a duplicate name is an error.

    domains = build_domains(["bank", "inventory", "weather"], extra_blueprints=[], spec_domains=specs)
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
from k2post.toolsets.spec_templates import spec_templates
from k2post.toolsets.spec_toolset import SpecState, SpecToolset
from k2post.chat.types import ToolSpec
from k2post.synth.specs import DomainSpec
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


def spec_domain(spec: DomainSpec) -> Domain:
    """A domain over the tools of an MCP spec file, simulated from their schemas."""
    toolset = SpecToolset(spec.domain, spec.description, spec.tools, spec.output_schemas, spec.annotations)
    templates = spec_templates(toolset)
    if not templates:
        raise DomainError(f"{spec.source}: no tool of domain {spec.domain!r} gives a task whose reference call runs")
    return Domain(spec.domain, toolset.description, toolset.context, toolset, templates, SpecState.model_validate)


def load_world(dump: dict[str, Any]) -> ToolsetState:
    """Any domain's simulator state from its dump: a built-in toolset's, a spec domain's (`collections`)
    or a record store's (`records`)."""
    if dump.get("toolset") in TOOLSETS:
        return load_state(dump)
    if "collections" in dump:
        return SpecState.model_validate(dump)
    return RecordStoreState.model_validate(dump)


def known_domain_names(
    extra: list[DomainBlueprint] | None = None, spec_domains: list[DomainSpec] | None = None
) -> list[str]:
    """Every domain name buildable here (toolsets, built-in blueprints, `extra`, spec files)."""
    names = list(TOOLSETS) + list(BLUEPRINTS) + [bp.domain for bp in extra or []]
    return names + [spec.domain for spec in spec_domains or [] if spec.domain not in names]


def build_domains(
    names: list[str],
    extra_blueprints: list[DomainBlueprint] | None = None,
    spec_domains: list[DomainSpec] | None = None,
) -> dict[str, Domain]:
    """The named domains; DomainError for unknown or duplicate names. A spec file named like a built-in
    toolset only rewords it (`check_specs`); any other spec domain is simulated from its schemas."""
    extra = {bp.domain: bp for bp in extra_blueprints or []}
    specs = {spec.domain: spec for spec in spec_domains or [] if spec.domain not in TOOLSETS}
    taken = sorted(set(specs) & set(BLUEPRINTS))
    if taken:
        where = specs[taken[0]].source
        raise DomainError(f"{where}: spec domain {taken[0]!r} is a built-in record-store domain: set another `domain`")
    clash = sorted(set(extra) & (set(TOOLSETS) | set(BLUEPRINTS) | set(specs)))
    if clash:
        raise DomainError(f"synthetic domain {clash[0]!r} is already a built-in or spec domain: rename it")
    if len(set(names)) != len(names):
        raise DomainError(f"domain listed twice in {names}")
    domains = {}
    for name in names:
        if name in TOOLSETS:
            domains[name] = toolset_domain(name)
        elif name in specs:
            domains[name] = spec_domain(specs[name])
        elif name in BLUEPRINTS or name in extra:
            domains[name] = blueprint_domain(extra.get(name) or BLUEPRINTS[name])
        else:
            known = ", ".join(known_domain_names(list(extra.values()), list(specs.values())))
            raise DomainError(f"unknown domain {name!r}; known: {known} (or add a tool spec file for it)")
    return domains
