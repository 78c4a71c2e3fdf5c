"""A simulated file system: text files and directories under one root.

Paths are relative to the root (`/`, `./` and `..` are resolved); a file's directory must
exist before it is written or moved into. Tools: list_dir, read_file, write_file, delete_file,
make_dir, move. Templates: move a file and report its first line, append a line to a file,
delete the `.tmp` files of a directory and report how many.
"""

from __future__ import annotations

import contextlib
import posixpath
import random
from typing import Any, ClassVar, Literal

from pydantic import Field

from k2post.toolsets.base import ToolError, Toolset, ToolsetState, tool_spec
from k2post.toolsets.checks import (
    Checkpoint,
    Scenario,
    StateCheck,
    called,
    count_alternatives,
    expect,
    ref_call,
)

_PATH = {
    "type": "string",
    "minLength": 1,
    "description": "Path relative to the root, e.g. docs/a.txt.",
}


class FileSystemState(ToolsetState):
    """Files (path → text) and directories (paths, the root excluded)."""

    toolset: Literal["filesystem"] = "filesystem"
    files: dict[str, str] = Field(default_factory=dict, description="File path → content.")
    dirs: list[str] = Field(default_factory=list, description="Directory paths.")


def normalize_path(path: str) -> str:
    """Canonical relative path (`""` is the root); `..` above the root is an error."""
    parts: list[str] = []
    for part in path.strip().replace("\\", "/").split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise ToolError(f"path {path!r} leaves the root directory")
            parts.pop()
        else:
            parts.append(part)
    return "/".join(parts)


def _is_dir(state: FileSystemState, path: str) -> bool:
    return path == "" or path in state.dirs


def _file_path(state: FileSystemState, raw: str) -> str:
    """The normalized path of an existing file."""
    path = normalize_path(raw)
    if _is_dir(state, path):
        raise ToolError(f"{raw!r} is a directory, not a file")
    if path not in state.files:
        raise ToolError(f"no such file {raw!r}")
    return path


def _new_path(state: FileSystemState, raw: str) -> str:
    """The normalized path of a file about to be written: parent exists, not a directory."""
    path = normalize_path(raw)
    if path == "" or _is_dir(state, path):
        raise ToolError(f"{raw!r} is a directory, not a file")
    parent = posixpath.dirname(path)
    if not _is_dir(state, parent):
        raise ToolError(f"directory {parent + '/'!r} does not exist (create it with make_dir)")
    return path


class FileSystemToolset(Toolset):
    """Tools over a FileSystemState."""

    name: ClassVar[str] = "filesystem"
    description: ClassVar[str] = "a file system"
    context: ClassVar[str] = "Paths are relative to the root directory '/'."
    state_cls: ClassVar[type[ToolsetState]] = FileSystemState
    specs = (
        tool_spec(
            "list_dir",
            "List the entries of a directory (subdirectories end with '/').",
            {"path": {**_PATH, "default": "/", "description": "Directory; '/' is the root."}},
            [],
        ),
        tool_spec("read_file", "Return the full text of a file.", {"path": _PATH}, ["path"]),
        tool_spec(
            "write_file",
            "Create or overwrite a file with the given text.",
            {"path": _PATH, "content": {"type": "string", "description": "The new full text."}},
            ["path", "content"],
        ),
        tool_spec("delete_file", "Delete a file.", {"path": _PATH}, ["path"]),
        tool_spec("make_dir", "Create a directory (its parent must exist).", {"path": _PATH}, ["path"]),
        tool_spec(
            "move",
            "Move or rename a file. A destination that is a directory keeps the file name.",
            {"source": _PATH, "destination": _PATH},
            ["source", "destination"],
        ),
    )

    def canonical_arguments(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        canonical = dict(arguments)
        for key in ("path", "source", "destination"):
            if isinstance(canonical.get(key), str):
                with contextlib.suppress(ToolError):
                    canonical[key] = normalize_path(canonical[key])
        return canonical

    def tool_list_dir(self, state: FileSystemState, path: str) -> str:
        directory = normalize_path(path)
        if not _is_dir(state, directory):
            raise ToolError(f"no such directory {path!r}")
        names = [posixpath.basename(d) + "/" for d in state.dirs if posixpath.dirname(d) == directory]
        names += [posixpath.basename(f) for f in state.files if posixpath.dirname(f) == directory]
        names.sort()
        return "\n".join(names) if names else "(empty directory)"

    def tool_read_file(self, state: FileSystemState, path: str) -> str:
        return state.files[_file_path(state, path)]

    def tool_write_file(self, state: FileSystemState, path: str, content: str) -> str:
        target = _new_path(state, path)
        state.files[target] = content
        return f"Wrote {len(content)} characters to {target}"

    def tool_delete_file(self, state: FileSystemState, path: str) -> str:
        target = _file_path(state, path)
        del state.files[target]
        return f"Deleted {target}"

    def tool_make_dir(self, state: FileSystemState, path: str) -> str:
        target = normalize_path(path)
        if target == "" or target in state.dirs or target in state.files:
            raise ToolError(f"{path!r} already exists")
        if not _is_dir(state, posixpath.dirname(target)):
            raise ToolError(f"parent directory of {path!r} does not exist")
        state.dirs = sorted([*state.dirs, target])
        return f"Created directory {target}/"

    def tool_move(self, state: FileSystemState, source: str, destination: str) -> str:
        origin = _file_path(state, source)
        target = normalize_path(destination)
        if _is_dir(state, target):
            target = posixpath.join(target, posixpath.basename(origin))
        elif destination.rstrip().endswith("/"):
            raise ToolError(f"no such directory {destination!r}")
        target = _new_path(state, target)
        if target in state.files:
            raise ToolError(f"{target!r} already exists (delete it first)")
        state.files[target] = state.files.pop(origin)
        return f"Moved {origin} to {target}"


# --- task templates -----------------------------------------------------------------------

_STEMS = (
    "report",
    "notes",
    "budget",
    "summary",
    "draft",
    "minutes",
    "plan",
    "invoice",
    "roadmap",
    "agenda",
    "memo",
    "proposal",
    "changelog",
    "contacts",
)
_DIRS = ("archive", "backup", "old", "docs", "projects", "shared", "reports", "inbox")
_SUBJECTS = (
    "Q1 revenue",
    "Q2 revenue",
    "Q3 revenue",
    "Q4 revenue",
    "Support tickets",
    "Server costs",
    "Headcount",
    "Churn",
    "Signups",
    "Ad spend",
    "Returns",
    "Shipping delays",
)
_VERBS = ("grew", "fell", "held at", "rose", "dropped")
_FILLER = (
    "See the appendix for details.",
    "Numbers are preliminary.",
    "Owner: finance team.",
    "Next review in two weeks.",
    "Draft - do not share.",
    "Contact ops with questions.",
)
_CHORES = (
    "Call the landlord",
    "Renew passport",
    "Book dentist appointment",
    "Pay the water bill",
    "Order printer ink",
    "Email the accountant",
    "Water the plants",
    "Back up the laptop",
)


def _sentence(rng: random.Random) -> str:
    return f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.randint(2, 60)}%"


def _document(rng: random.Random, first_line: str) -> str:
    return "\n".join([first_line, *rng.sample(_FILLER, rng.randint(1, 3))]) + "\n"


def _state(rng: random.Random, files: dict[str, str], dirs: list[str]) -> dict[str, Any]:
    state = FileSystemState(seed=rng.randrange(2**31), files=dict(sorted(files.items())), dirs=sorted(dirs))
    return state.model_dump(mode="json")


def _unchanged(files: dict[str, str], paths: list[str]) -> list[StateCheck]:
    return [expect(["files", path], "equals", files[path]) for path in paths]


def _move_world(rng: random.Random) -> tuple[dict[str, str], str, str, str]:
    """(files, target file, destination folder, its first line) of a move task."""
    stems = rng.sample(_STEMS, rng.randint(3, 5))
    folder = rng.choice(_DIRS)
    target, first_line = f"{stems[0]}.txt", _sentence(rng)
    files = {f"{stem}.txt": _document(rng, _sentence(rng)) for stem in stems[1:]}
    files[f"{folder}/{stems[1]}-{rng.randint(2019, 2023)}.txt"] = _document(rng, _sentence(rng))
    files[target] = _document(rng, first_line)
    return files, target, folder, first_line


def move_and_read(rng: random.Random) -> Scenario:
    """Move a file into a directory and report its first line."""
    files, target, folder, first_line = _move_world(rng)
    dirs = [folder, rng.choice([d for d in _DIRS if d != folder])]
    moved, others = f"{folder}/{target}", sorted(set(files) - {target})
    return Scenario(
        toolset="filesystem",
        template="fs_move_and_read",
        prompt=f"Move {target} into the {folder}/ folder and tell me its first line.",
        initial_state=_state(rng, files, dirs),
        success=[
            expect(["files", moved], "equals", files[target], f"{moved} has the text"),
            expect(["files", target], "absent", description=f"{target} is gone"),
        ],
        checkpoints=[
            Checkpoint(
                id="read_file",
                description=f"read_file on {target} (or {moved})",
                calls=[called("read_file", path=target), called("read_file", path=moved)],
            ),
            Checkpoint(
                id="moved_cleanly",
                description=f"move of {target} with no other file changed",
                calls=[called("move", source=target)],
                state=_unchanged(files, others),
            ),
        ],
        answer=[[first_line]],
        reference_turns=[
            [ref_call("read_file", path=target)],
            [ref_call("move", source=target, destination=f"{folder}/")],
        ],
        reference_answer=f"Moved {target} to {moved}. Its first line is: {first_line}",
    )


def append_line(rng: random.Random) -> Scenario:
    """Append a line to a file (read it, write it back with the line added)."""
    folder = rng.choice(_DIRS)
    chores = rng.sample(_CHORES, rng.randint(3, 5))
    path = f"{folder}/{rng.choice(('todo', 'errands', 'tasks'))}.txt"
    old = "\n".join(chores[1:]) + "\n"
    files = {path: old, f"{folder}/{rng.choice(_STEMS)}.txt": _document(rng, _sentence(rng))}
    files[f"{rng.choice(_STEMS)}.txt"] = _document(rng, _sentence(rng))
    new = old + chores[0] + "\n"
    return Scenario(
        toolset="filesystem",
        template="fs_append_line",
        prompt=f'Add the line "{chores[0]}" at the end of {path}, keeping the existing lines.',
        initial_state=_state(rng, files, [folder]),
        success=[expect(["files", path], "text_equals", new, "line appended")],
        checkpoints=[
            Checkpoint(
                id="read_before_write",
                description=f"read_file on {path} before write_file on it",
                calls=[called("read_file", path=path)],
                before=called("write_file", path=path),
            ),
            Checkpoint(
                id="wrote_cleanly",
                description=f"write_file on {path} with no other file changed",
                calls=[called("write_file", path=path)],
                state=_unchanged(files, sorted(set(files) - {path})),
            ),
        ],
        reference_turns=[
            [ref_call("read_file", path=path)],
            [ref_call("write_file", path=path, content=new)],
        ],
        reference_answer=f'Done: "{chores[0]}" is now the last line of {path}.',
    )


def delete_tmp_files(rng: random.Random) -> Scenario:
    """Delete the .tmp files of one directory (only there) and report the count."""
    folder, stems, count = rng.choice(_DIRS), rng.sample(_STEMS, 7), rng.randint(2, 4)
    doomed = [f"{folder}/{stem}.tmp" for stem in stems[:count]]
    kept = [f"{folder}/{stems[count]}.txt", f"{folder}/{stems[count + 1]}.md", f"{stems[-1]}.tmp"]
    files = {path: _document(rng, _sentence(rng)) for path in doomed + kept}
    expected = {path: text for path, text in sorted(files.items()) if path not in doomed}
    return Scenario(
        toolset="filesystem",
        template="fs_delete_tmp",
        prompt=(
            f"Delete every .tmp file inside {folder}/ (leave everything else alone) "
            "and tell me how many files you deleted."
        ),
        initial_state=_state(rng, files, [folder]),
        success=[expect(["files"], "equals", expected, "exactly those files deleted")],
        checkpoints=[
            Checkpoint(id="listed_dir", calls=[called("list_dir", path=folder)]),
            Checkpoint(id="tmp_deleted", state=[expect(["files", p], "absent") for p in doomed]),
            Checkpoint(
                id="others_intact",
                description="files were deleted, and the other files remain",
                calls=[called("delete_file")],
                state=_unchanged(files, kept),
            ),
        ],
        answer=[count_alternatives(count)],
        reference_turns=[
            [ref_call("list_dir", path=folder)],
            [ref_call("delete_file", path=path) for path in sorted(doomed)],
        ],
        reference_answer=f"I deleted {count} files: {', '.join(sorted(doomed))}.",
    )


TEMPLATES = {
    "fs_move_and_read": move_and_read,
    "fs_append_line": append_line,
    "fs_delete_tmp": delete_tmp_files,
}
