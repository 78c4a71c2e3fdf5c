"""MCP-style tool specs: load a directory of JSON files, validate them, name what is wrong.

One file per domain:

    {"domain": "bank", "description": "a personal bank account",
     "tools": [{"name": "get_balance", "description": "...",
                "inputSchema": {"type": "object", "properties": {"account": {"type": "string"}},
                                "required": ["account"]}}]}

`inputSchema` (MCP) or `parameters` (OpenAI) both work. Problems come back as one line naming the
file and the field: `specs/bank.json: tools[2].inputSchema.required[0]: 'amount' is not a property`.

    domains = load_tool_specs("environments/data/tool_specs")     # list[DomainSpec]
    write_toolset_specs(out_dir)                                   # the shipped files, from the toolsets
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from k2post.chat.types import ToolSpec, dump_json
from k2post.envs.registry import builtin_data_dir

JSON_TYPES = ("string", "integer", "number", "boolean", "array", "object", "null")
NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
SHIPPED_SPECS = builtin_data_dir("data", "tool_specs")


class ToolSpecError(ValueError):
    """A tool spec file is malformed; the message names the file and the field."""


class DomainSpec(BaseModel):
    """The tools of one domain, as loaded from one spec file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    domain: str = Field(description="Domain name (unique across the loaded files).")
    description: str = Field("", description="What the tools act on, for the agent's system prompt.")
    tools: list[ToolSpec] = Field(description="The validated tools.")
    source: str = Field("", description="The file it came from.")


def _schema_problem(schema: Any, where: str) -> str | None:
    """First problem of a JSON schema for one property/argument value, or None."""
    if not isinstance(schema, dict):
        return f"{where}: must be an object, got {type(schema).__name__}"
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    if kind is not None and not all(k in JSON_TYPES for k in kinds):
        return f"{where}.type: {kind!r} is not a JSON type ({', '.join(JSON_TYPES)})"
    if "enum" in schema and not (isinstance(schema["enum"], list) and schema["enum"]):
        return f"{where}.enum: must be a non-empty list"
    if "items" in schema:
        return _schema_problem(schema["items"], f"{where}.items")
    if kind == "object" and "properties" in schema:
        return _object_problem(schema, where)
    return None


def _object_problem(schema: dict[str, Any], where: str) -> str | None:
    """First problem of an object schema (properties, required), or None."""
    properties = schema.get("properties", {})
    if not isinstance(properties, dict):
        return f"{where}.properties: must be an object mapping names to schemas"
    for name, sub in properties.items():
        problem = _schema_problem(sub, f"{where}.properties.{name}")
        if problem:
            return problem
    required = schema.get("required", [])
    if not isinstance(required, list):
        return f"{where}.required: must be a list of property names"
    for position, name in enumerate(required):
        if name not in properties:
            return f"{where}.required[{position}]: {name!r} is not a property"
    return None


def _input_schema(tool: dict[str, Any], where: str) -> tuple[str, Any]:
    if "inputSchema" in tool:
        return f"{where}.inputSchema", tool["inputSchema"]
    if "parameters" in tool:
        return f"{where}.parameters", tool["parameters"]
    return f"{where}.inputSchema", {"type": "object", "properties": {}}


def validate_tool(tool: Any, where: str) -> ToolSpec:
    """One MCP/OpenAI tool dict as a ToolSpec; ToolSpecError (naming `where`) if malformed."""
    if not isinstance(tool, dict):
        raise ToolSpecError(f"{where}: must be an object, got {type(tool).__name__}")
    tool = tool.get("function", tool) if tool.get("type") == "function" else tool
    name = tool.get("name")
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ToolSpecError(f"{where}.name: {name!r} is not a valid tool name (letters, digits, _; at most 64)")
    if not isinstance(tool.get("description", ""), str):
        raise ToolSpecError(f"{where}.description: must be a string")
    schema_where, schema = _input_schema(tool, where)
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise ToolSpecError(f"{schema_where}: must be a JSON schema with type 'object'")
    problem = _object_problem(schema, schema_where)
    if problem:
        raise ToolSpecError(problem)
    return ToolSpec(name=name, description=tool.get("description", ""), parameters=schema)


def parse_domain_spec(data: Any, source: str) -> DomainSpec:
    """Validate one file's content (already JSON-decoded)."""
    if not isinstance(data, dict):
        raise ToolSpecError(f"{source}: top level must be an object with 'domain' and 'tools'")
    unknown = sorted(set(data) - {"domain", "description", "tools"})
    if unknown:
        raise ToolSpecError(f"{source}: {unknown[0]}: unknown key (expected domain, description, tools)")
    domain = data.get("domain")
    if not isinstance(domain, str) or not NAME_PATTERN.match(domain):
        raise ToolSpecError(f"{source}: domain: {domain!r} is not a valid name")
    tools = data.get("tools")
    if not isinstance(tools, list) or not tools:
        raise ToolSpecError(f"{source}: tools: must be a non-empty list")
    specs = [validate_tool(tool, f"{source}: tools[{i}]") for i, tool in enumerate(tools)]
    names = [spec.name for spec in specs]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate:
        raise ToolSpecError(f"{source}: tools: tool name {duplicate!r} appears twice")
    return DomainSpec(domain=domain, description=data.get("description", ""), tools=specs, source=source)


def load_tool_specs(directory: str | Path) -> list[DomainSpec]:
    """Every `*.json` spec file of `directory`, validated; domain names must be unique."""
    root = Path(directory)
    if not root.is_dir():
        raise ToolSpecError(f"{root}: tool spec directory does not exist")
    domains: dict[str, DomainSpec] = {}
    for path in sorted(root.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ToolSpecError(f"{path}: not valid JSON: {err}") from None
        spec = parse_domain_spec(data, str(path))
        if spec.domain in domains:
            raise ToolSpecError(f"{path}: domain: {spec.domain!r} is already defined in {domains[spec.domain].source}")
        domains[spec.domain] = spec
    if not domains:
        raise ToolSpecError(f"{root}: no *.json tool spec files")
    return list(domains.values())


def domain_spec_json(domain: str, description: str, tools: list[ToolSpec]) -> str:
    """The MCP-style file content for a domain's tools."""
    entries = [{"name": t.name, "description": t.description, "inputSchema": t.parameters} for t in tools]
    return (
        json.dumps({"domain": domain, "description": description, "tools": entries}, indent=2, ensure_ascii=False)
        + "\n"
    )


def write_toolset_specs(out_dir: str | Path) -> list[Path]:
    """Write one spec file per built-in toolset (how the shipped files were made)."""
    from k2post.toolsets import TOOLSETS

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, toolset in TOOLSETS.items():
        path = out / f"{name}.json"
        path.write_text(domain_spec_json(name, toolset.description, toolset.tools()))
        paths.append(path)
    return paths


def spec_fingerprint(tools: list[ToolSpec]) -> str:
    """Canonical JSON of a tool list (to compare shipped files with the simulators' own specs)."""
    return dump_json([tool.to_openai() for tool in tools])
