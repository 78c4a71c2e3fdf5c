"""MCP tool specs: load JSON files (or directories of them), validate them, name what is wrong.

One file per domain, in any of these shapes:

    {"domain": "bank", "description": "a personal bank account",
     "tools": [{"name": "get_balance", "description": "...",
                "inputSchema": {"type": "object", "properties": {"account": {"type": "string"}},
                                "required": ["account"]}}]}
    {"tools": [...], "nextCursor": null}                        # an MCP `tools/list` result
    {"jsonrpc": "2.0", "id": 1, "result": {"tools": [...]}}     # the whole JSON-RPC response
    [...]                                                       # a bare list of tools

Without a `domain` key the domain is the file's name (`weather.json` -> `weather`). `inputSchema` (MCP)
or `parameters` (OpenAI) both work; `outputSchema` and `annotations` (MCP) are kept for the simulator;
local `$ref`s are inlined (at most 5000 schema nodes; `pattern`s must compile, `minLength`/`minItems` are capped:
`k2post.toolsets.schema_values.limit_problem`). Problems come back as one line naming the file and the field:
`specs/bank.json: tools[2].inputSchema.required[0]: 'amount' is not a property`.

    domains = load_tool_specs(["specs/weather.json", "more_specs/"])    # list[DomainSpec]
    write_toolset_specs(out_dir)                                         # the shipped files, from the toolsets
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from k2post.chat.types import ToolSpec, dump_json
from k2post.envs.registry import builtin_data_dir
from k2post.toolsets.schema_values import SchemaTooLarge, inline_refs, limit_problem

JSON_TYPES = ("string", "integer", "number", "boolean", "array", "object", "null")
NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
TOOL_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")
"""MCP tool names: letters, digits, `_`, `-`, `.`; at most 128 (the K2 call id `functions.NAME:IDX` holds them)."""
SHIPPED_SPECS = builtin_data_dir("data", "tool_specs")


class ToolSpecError(ValueError):
    """A tool spec file is malformed; the message names the file and the field."""


class DomainSpec(BaseModel):
    """The tools of one domain, as loaded from one spec file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    domain: str = Field(description="Domain name (unique across the loaded files).")
    description: str = Field("", description="What the tools act on, for the agent's system prompt.")
    tools: list[ToolSpec] = Field(description="The validated tools.")
    output_schemas: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="Tool name -> its MCP outputSchema (tools that declare one)."
    )
    annotations: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="Tool name -> its MCP annotations (readOnlyHint, destructiveHint, ...)."
    )
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


def bounded_schema(schema: dict[str, Any], where: str) -> dict[str, Any]:
    """`schema` with its local `$ref`s inlined, if checking and simulating it stays bounded (node count, nesting,
    patterns, minLength/minItems, value size: `schema_values.limit_problem`); ToolSpecError naming `where` if not."""
    try:
        inlined = inline_refs(schema)
    except SchemaTooLarge as err:
        raise ToolSpecError(f"{where}: {err}") from None
    problem = limit_problem(inlined, where)
    if problem:
        raise ToolSpecError(problem)
    return inlined


def _input_schema(tool: dict[str, Any], where: str) -> tuple[str, Any]:
    if "inputSchema" in tool:
        return f"{where}.inputSchema", tool["inputSchema"]
    if "parameters" in tool:
        return f"{where}.parameters", tool["parameters"]
    return f"{where}.inputSchema", {"type": "object", "properties": {}}


def validate_tool(tool: Any, where: str) -> ToolSpec:
    """One MCP/OpenAI tool dict as a ToolSpec (local `$ref`s inlined); ToolSpecError (naming `where`)
    if malformed."""
    if not isinstance(tool, dict):
        raise ToolSpecError(f"{where}: must be an object, got {type(tool).__name__}")
    tool = tool.get("function", tool) if tool.get("type") == "function" else tool
    name = tool.get("name")
    if not isinstance(name, str) or not TOOL_NAME_PATTERN.match(name):
        raise ToolSpecError(f"{where}.name: {name!r} is not a valid tool name (letters, digits, _ - .; at most 128)")
    if not isinstance(tool.get("description", ""), str):
        raise ToolSpecError(f"{where}.description: must be a string")
    schema_where, schema = _input_schema(tool, where)
    schema = bounded_schema(schema, schema_where) if isinstance(schema, dict) else schema
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise ToolSpecError(f"{schema_where}: must be a JSON schema with type 'object'")
    problem = _object_problem(schema, schema_where)
    if problem:
        raise ToolSpecError(problem)
    return ToolSpec(name=name, description=tool.get("description", ""), parameters=schema)


def _tool_extras(tools: list[Any], key: str, where: str) -> dict[str, dict[str, Any]]:
    """Tool name -> the `outputSchema` / `annotations` object of each tool that has one."""
    found = {}
    for position, tool in enumerate(tools):
        value = tool.get(key) if isinstance(tool, dict) else None
        if value is None:
            continue
        if not isinstance(value, dict):
            raise ToolSpecError(f"{where}: tools[{position}].{key}: must be an object")
        extra = f"{where}: tools[{position}].{key}"
        found[tool["name"]] = bounded_schema(value, extra) if key == "outputSchema" else value
    return found


def _unwrapped(data: Any, source: str) -> dict[str, Any]:
    """Any accepted file shape as {domain?, description?, tools}."""
    if isinstance(data, list):
        return {"tools": data}
    if isinstance(data, dict) and isinstance(data.get("result"), dict) and "jsonrpc" in data:
        return {"tools": data["result"].get("tools")}
    if isinstance(data, dict) and ("tools" in data or "domain" in data):
        return {k: v for k, v in data.items() if k != "nextCursor"}
    raise ToolSpecError(
        f"{source}: top level must be a tools/list result ({{'tools': [...]}}), a list of tools, "
        "or an object with 'domain' and 'tools'"
    )


def domain_from_file(source: str) -> str:
    """The domain name of a spec file without a `domain` key: its name, made a valid identifier."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", Path(source).stem) or "tools"
    return name if NAME_PATTERN.match(name) else f"d_{name}"[:64]


def parse_domain_spec(data: Any, source: str) -> DomainSpec:
    """Validate one file's content (already JSON-decoded)."""
    data = _unwrapped(data, source)
    unknown = sorted(set(data) - {"domain", "description", "tools"})
    if unknown:
        raise ToolSpecError(f"{source}: {unknown[0]}: unknown key (expected domain, description, tools)")
    domain = data.get("domain", domain_from_file(source))
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
    plain = [tool.get("function", tool) if tool.get("type") == "function" else tool for tool in tools]
    return DomainSpec(
        domain=domain,
        description=data.get("description", ""),
        tools=specs,
        output_schemas=_tool_extras(plain, "outputSchema", source),
        annotations=_tool_extras(plain, "annotations", source),
        source=source,
    )


def _spec_files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(path.glob("*.json"))
    if path.is_file():
        return [path]
    raise ToolSpecError(f"{path}: tool spec file or directory does not exist")


def load_tool_specs(paths: str | Path | list[str | Path]) -> list[DomainSpec]:
    """Every spec file named, or `*.json` in each directory named, validated; domain names must be unique."""
    domains: dict[str, DomainSpec] = {}
    for root in [paths] if isinstance(paths, (str, Path)) else paths:
        files = _spec_files(Path(root))
        if not files:
            raise ToolSpecError(f"{root}: no *.json tool spec files")
        for path in files:
            spec = parse_domain_spec(_read_json(path), str(path))
            if spec.domain in domains:
                raise ToolSpecError(
                    f"{path}: domain: {spec.domain!r} is already defined in {domains[spec.domain].source}"
                )
            domains[spec.domain] = spec
    return list(domains.values())


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ToolSpecError(f"{path}: not UTF-8 text") from None
    except (json.JSONDecodeError, RecursionError) as err:
        raise ToolSpecError(f"{path}: not valid JSON: {err}") from None


def domain_spec_json(
    domain: str,
    description: str,
    tools: list[ToolSpec],
    output_schemas: dict[str, dict[str, Any]] | None = None,
    annotations: dict[str, dict[str, Any]] | None = None,
) -> str:
    """The MCP-style file content for a domain's tools (with the outputSchema and annotations of those
    that declare them)."""
    outputs, notes = output_schemas or {}, annotations or {}
    entries = [
        {"name": t.name, "description": t.description, "inputSchema": t.parameters}
        | ({"outputSchema": outputs[t.name]} if t.name in outputs else {})
        | ({"annotations": notes[t.name]} if t.name in notes else {})
        for t in tools
    ]
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
