"""Output dirs of commands that read one model dir and write another (`model prepare`, `model export`).

The rule, so that no command ever deletes its input:
- `check_out_dir`: OUT equal to the source, inside it, or containing it (also through symlinks, and a source
  file that links into OUT) is refused with one line, as is OUT that is a file or lies under one, and an
  existing non-empty OUT without `overwrite`. The checks run before anything is loaded.
- `staged_dir`: the command writes into a fresh temporary dir beside OUT; only when it is complete is the old
  OUT (if any) moved aside, the new one renamed into place and the old one deleted. A failure part way leaves
  OUT as it was and no temporary dir behind. `--overwrite` never deletes anything but the old OUT.

    check_out_dir(Path(src), Path(out), overwrite, "--out")
    with staged_dir(Path(out)) as tmp:
        model.save_pretrained(tmp)
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class OutDirError(ValueError):
    """OUT would overwrite or delete the source, or is taken (one line naming the flag and the path)."""


def _inside(path: Path, root: Path) -> bool:
    """Whether resolved `path` is `root` or below it."""
    return path == root or path.is_relative_to(root)


def _links_into(source: Path, out: Path) -> Path | None:
    """A file of `source` (top level) whose target lies in `out`, or None (its weights would go with old OUT)."""
    for entry in source.iterdir() if source.is_dir() else []:
        if entry.is_symlink() and _inside(entry.resolve(), out):
            return entry
    return None


def first_existing(path: Path) -> Path:
    """`path` or its nearest existing ancestor."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def source_problem(source: Path, out: Path) -> str | None:
    """Why writing OUT (and replacing an old one) would touch the source, or None."""
    src, dst = source.resolve(), out.resolve()
    if dst == src:
        return "is the source dir (the source is left as it is: pick another dir)"
    if _inside(src, dst):
        return f"contains the source {source} (replacing it would delete the source): pick a dir beside it"
    if _inside(dst, src):
        return f"is inside the source {source}: pick a dir outside it"
    link = _links_into(source, dst)
    return f"holds what the source's {link.name} links to: pick another dir" if link else None


def check_out_dir(source: Path, out: Path, overwrite: bool, flag: str) -> None:
    """OutDirError (one line `<flag> <out>: ...`) when OUT may not be written; nothing when it may."""
    problem = source_problem(source, out)
    if problem:
        raise OutDirError(f"{flag} {out}: {problem}")
    check_new_dir(out, overwrite, flag)


def check_new_dir(out: Path, overwrite: bool, flag: str) -> None:
    """OutDirError (one line) when a command may not write the dir OUT: a file, under a file, in a dir it cannot
    write, or taken (non-empty) without `overwrite`."""
    problem = None
    if out.exists() and not out.is_dir():
        problem = "exists and is not a directory (--overwrite replaces only a directory)"
    if problem is None and not first_existing(out.parent).is_dir():
        problem = f"lies under {first_existing(out.parent)}, which is a file, not a directory"
    if problem is None and not os.access(first_existing(out.parent), os.W_OK | os.X_OK):
        problem = f"cannot be written: {first_existing(out.parent)} is not writable"
    if problem is None and out.is_dir() and any(out.iterdir()) and not overwrite:
        problem = "exists and is not empty (pass --overwrite to replace it)"
    if problem:
        raise OutDirError(f"{flag} {out}: {problem}")


def replace_dir(new: Path, out: Path) -> None:
    """Rename the complete `new` to `out`; an old `out` is moved aside first and deleted last."""
    old = None
    if out.is_symlink() or out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        old.rmdir()
        os.replace(out, old)
    try:
        os.replace(new, out)
    except OSError:
        if old is not None:
            os.replace(old, out)  # put the old one back: OUT is never left missing
        raise
    if old is not None:
        old.unlink() if old.is_symlink() else shutil.rmtree(old, ignore_errors=True)


@contextmanager
def staged_dir(out: Path) -> Iterator[Path]:
    """A temporary dir beside `out` to write into; renamed to `out` when the block ends without an error."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    except OSError as err:
        raise OutDirError(f"{out}: cannot create a dir beside it ({err.strerror or err})") from None
    tmp.chmod(0o755)  # mkdtemp makes 0700; the output is as readable as a dir `mkdir` makes
    try:
        yield tmp
        replace_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
