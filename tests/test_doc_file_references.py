"""Docs and docstrings name only files a user has: no pointer to a file outside the repository (a
`REFERENCE.md`, a `shared/` folder: notes that never shipped), and every `*.md` file or repository path they
name exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCANNED = ["README.md", "docs", "k2post", "pipelines", "environments", "rubrics", "checkpoint_engine", "configs",
           "benchmarks", "tests"]  # fmt: skip
NOT_SHIPPED = re.compile(r"\bREFERENCE\.md\b|(?<![\w.-])(?:\.\./)*shared/")
MARKDOWN = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[A-Z][A-Z0-9_]*\.md)\b")
REPO_PATH = re.compile(
    r"(?<![\w/.-])((?:docs|k2post|pipelines|environments|rubrics|checkpoint_engine|benchmarks)/[\w./-]*\w\.(?:py|md))\b"
)
NOT_CHECKED_FOR_EXISTENCE = ("tests/", "docs/LOG.md")  # tests name missing files on purpose; LOG.md is a diary


def _files() -> list[Path]:
    out = []
    for name in SCANNED:
        root = REPO / name
        found = [root] if root.is_file() else [*root.rglob("*.md"), *root.rglob("*.py"), *root.rglob("*.yaml")]
        out += [path for path in found if ".venv" not in path.parts]
    return sorted(out)


def _exists(named: str, where: Path) -> bool:
    """Whether a named file exists: from the repo root, beside the file naming it, or (bare `X.md`) in docs/."""
    return any(p.exists() for p in (REPO / named, where.parent / named, REPO / "docs" / named))


def missing_references(text: str, where: Path, check_existence: bool = True) -> list[str]:
    """`line N: name` for every pointer outside the repository (REFERENCE.md, shared/) and, with
    `check_existence`, every named `X.md` / repository path that does not exist."""
    problems = []
    for number, line in enumerate(text.splitlines(), start=1):
        outside = [m.group(0) for m in NOT_SHIPPED.finditer(line)]
        problems += [f"line {number}: {name} (not in the repository)" for name in outside]
        named = {m.group(1): None for pattern in (MARKDOWN, REPO_PATH) for m in pattern.finditer(line)}
        named = [n for n in named if check_existence and not any(o in n or n in o for o in outside)]
        problems += [f"line {number}: {name}" for name in named if not _exists(name, where)]
    return problems


@pytest.mark.parametrize(
    "text, problems",
    [
        ("formulas: `../shared/REFERENCE.md`", ["line 1: ../shared/ (not in the repository)",
                                                "line 1: REFERENCE.md (not in the repository)"]),
        ("see REFERENCE.md, 'Seen on this machine'", ["line 1: REFERENCE.md (not in the repository)"]),
        ("x\nread docs/NOPE.md and k2post/nope.py", ["line 2: docs/NOPE.md", "line 2: k2post/nope.py"]),
        ("a shared/ folder, the shared/notes.md file", ["line 1: shared/ (not in the repository)",
                                                        "line 1: shared/ (not in the repository)"]),
        ("docs/SFT.md, SFT.md, k2post/sft/sources.py, README.md", []),
        ("runs/rl_demo/final, environments/golden/<name>.jsonl, k2post.sft.data", []),
    ],
)  # fmt: skip
def test_the_checker_finds_what_it_should(text, problems):
    assert missing_references(text, REPO / "docs" / "X.md") == problems


def test_docs_and_docstrings_name_only_files_in_the_repository():
    problems = []
    for path in _files():
        relative = path.relative_to(REPO).as_posix()
        if path == Path(__file__).resolve():
            continue  # this file names the patterns it looks for
        check = not relative.startswith(NOT_CHECKED_FOR_EXISTENCE)
        problems += [f"{relative}:{p}" for p in missing_references(path.read_text(encoding="utf-8"), path, check)]
    assert problems == [], "\n".join(problems)
