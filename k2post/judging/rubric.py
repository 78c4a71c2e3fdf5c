"""Rubrics as data: the `Rubric` model, rubric files, and rubrics carried by tasks (the shipped files and
`builtin_rubrics` are the critic plug-in's: `rubrics/schema.py`).

A rubric tells the judge one thing to check when it compares two responses. Three kinds:

- `core`: clarity and relevance, conversational fluency, objective and grounded interaction
  (shipped in `rubrics/data/core.yaml`);
- `prescriptive`: hard style rules, e.g. no "Great question!" opener
  (shipped in `rubrics/data/prescriptive.yaml`);
- `task`: written for one prompt, carried by the dataset row in `metadata["rubrics"]`.

Usage:

    rubrics = builtin_rubrics()                       # core + prescriptive, in file order
    rubrics += task_rubrics(task)                     # Task, or a dataset-row dict
    extra = load_rubric_file("my_rubrics.yaml")       # same YAML format as the shipped files

A rubric file reads:

    kind: core            # core | prescriptive | task
    rubrics:
      - name: clarity_relevance
        title: Clarity and relevance
        text: "What the judge must check."

Every problem is reported as one `RubricFileError` line naming the file (or task) and the
field: `core.yaml: rubrics[1].text: field required`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

RubricKind = Literal["core", "prescriptive", "task"]
RUBRIC_KINDS: tuple[str, ...] = get_args(RubricKind)

_ENTRY_FIELDS = ("name", "title", "text")


class RubricFileError(ValueError):
    """A rubric file or a task's rubric list is malformed; the message is one line."""


class Rubric(BaseModel):
    """One rubric the judge applies when comparing two responses."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Identifier, unique within a rubric set (letters, digits, underscores).",
    )
    kind: RubricKind = Field(description="core, prescriptive or task.")
    title: str = Field(min_length=1, description="Short heading shown to the judge.")
    text: str = Field(min_length=1, description="What the judge must check, in a few sentences.")


def _first_error(exc: ValidationError, prefix: str) -> str:
    """`prefix.field: message` for the first pydantic error, in the file-error style."""
    error = exc.errors()[0]
    field = ".".join(str(part) for part in error["loc"])
    where = f"{prefix}.{field}" if field else prefix
    kind = error["type"]
    if kind == "missing":
        message = "field required"
    elif kind == "extra_forbidden":
        message = f"unknown field (allowed: {', '.join(_ENTRY_FIELDS)})"
    elif kind == "string_pattern_mismatch":
        message = f"{error['input']!r} is not an identifier (letters, digits, underscores)"
    else:
        message = error["msg"][:1].lower() + error["msg"][1:]
    return f"{where}: {message}"


def _make_rubric(entry: Any, kind: str, where: str) -> Rubric:
    """Validate one `{name, title, text}` mapping; `where` prefixes the error (`rubrics[2]`)."""
    if not isinstance(entry, Mapping):
        raise RubricFileError(f"{where}: expected a mapping with {', '.join(_ENTRY_FIELDS)}")
    if "kind" in entry:
        raise RubricFileError(f"{where}.kind: set kind once, at the top of the file")
    try:
        return Rubric(kind=kind, **{str(key): value for key, value in entry.items()})
    except ValidationError as exc:
        raise RubricFileError(_first_error(exc, where)) from None


def _check_unique(rubrics: list[Rubric], label: str) -> None:
    """Raise on the first repeated rubric name."""
    seen: set[str] = set()
    for index, rubric in enumerate(rubrics):
        if rubric.name in seen:
            raise RubricFileError(f"{label}rubrics[{index}].name: duplicate name {rubric.name!r}")
        seen.add(rubric.name)


def _read_yaml(path: Path) -> Any:
    """Parsed YAML of `path`; unreadable or invalid files raise `RubricFileError`."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RubricFileError(f"{path}: cannot read ({exc.__class__.__name__}: {exc})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" (line {mark.line + 1})" if mark is not None else ""
        raise RubricFileError(f"{path}: not valid YAML{line}") from None


def _check_top_level(data: Any, label: str) -> str:
    """Validate the `kind` + `rubrics` mapping of a file; return its kind."""
    if not isinstance(data, Mapping):
        raise RubricFileError(f"{label}: top level must be a mapping with 'kind' and 'rubrics'")
    for key in data:
        if key not in ("kind", "rubrics"):
            raise RubricFileError(f"{label}: {key}: unknown field (allowed: kind, rubrics)")
    for key in ("kind", "rubrics"):
        if key not in data:
            raise RubricFileError(f"{label}: {key}: field required")
    kind = data["kind"]
    if kind not in RUBRIC_KINDS:
        raise RubricFileError(f"{label}: kind: must be one of {', '.join(RUBRIC_KINDS)}, got {kind!r}")
    entries = data["rubrics"]
    if not isinstance(entries, list) or not entries:
        raise RubricFileError(f"{label}: rubrics: must be a non-empty list of name/title/text mappings")
    return kind


def load_rubric_file(path: str | Path) -> list[Rubric]:
    """Rubrics of one YAML file (format in the module docstring), in file order."""
    path = Path(path)
    data = _read_yaml(path)
    kind = _check_top_level(data, str(path))
    rubrics = [_make_rubric(entry, kind, f"{path}: rubrics[{index}]") for index, entry in enumerate(data["rubrics"])]
    _check_unique(rubrics, f"{path}: ")
    return rubrics


def _task_parts(task: Any) -> tuple[str, Any]:
    """`(task id, raw rubrics value)` of a `Task` or of a dataset-row mapping."""
    if isinstance(task, Mapping):
        metadata = task.get("metadata") or {}
        raw = task.get("rubrics", metadata.get("rubrics") if isinstance(metadata, Mapping) else None)
        return str(task.get("id", "?")), raw
    metadata = getattr(task, "metadata", None) or {}
    return str(getattr(task, "id", "?")), metadata.get("rubrics")


def _task_entry(entry: Any, index: int, label: str) -> Rubric:
    """A task rubric from a plain string or a `{name?, title?, text}` mapping."""
    where = f"{label}: rubrics[{index}]"
    default_name = f"task_{index + 1}"
    if isinstance(entry, str):
        if not entry.strip():
            raise RubricFileError(f"{where}: empty rubric text")
        return Rubric(name=default_name, kind="task", title=f"Task rubric {index + 1}", text=entry.strip())
    if isinstance(entry, Mapping):
        filled = {"name": default_name, "title": f"Task rubric {index + 1}", **entry}
        return _make_rubric(filled, "task", where)
    raise RubricFileError(f"{where}: expected a string or a name/title/text mapping, got {type(entry).__name__}")


def task_rubrics(task: Any) -> list[Rubric]:
    """Task-specific rubrics of a `Task` (`metadata["rubrics"]`) or a dataset row.

    A row may carry `rubrics` at the top level or in `metadata`. Each entry is a string
    (named `task_1`, `task_2`, ... by position) or a mapping with `text` and optional
    `name` / `title`. No rubrics → `[]`.
    """
    task_id, raw = _task_parts(task)
    if raw is None:
        return []
    label = f"task {task_id!r}"
    if not isinstance(raw, list):
        raise RubricFileError(f"{label}: rubrics: must be a list of strings or name/title/text mappings")
    rubrics = [_task_entry(entry, index, label) for index, entry in enumerate(raw)]
    _check_unique(rubrics, f"{label}: ")
    return rubrics
