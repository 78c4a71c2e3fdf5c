"""Checkpoint dirs: atomic publish (no partial dir after a crash), newest complete one, pruning."""

from __future__ import annotations

from pathlib import Path

import pytest

from k2post.train.checkpoint import (
    ENGINE_DIR,
    STATE_FILE,
    checkpoint_dir,
    complete_checkpoints,
    latest_checkpoint,
    prune_checkpoints,
    write_atomically,
)
from k2post.train.distributed import DistInfo

SINGLE = DistInfo(rank=0, world_size=1, local_rank=0, owns_group=False)


def _fake_checkpoint(tmp: Path) -> None:
    (tmp / ENGINE_DIR).mkdir()
    (tmp / STATE_FILE).write_text("{}")


def test_checkpoints_appear_atomically(tmp_path):
    target = checkpoint_dir(tmp_path, 3)
    target.parent.mkdir(parents=True)

    def crash(tmp: Path) -> None:
        _fake_checkpoint(tmp)
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomically(target, SINGLE, crash)
    assert not target.exists() and list(target.parent.iterdir()) == []  # no partial dir, no temp left
    write_atomically(target, SINGLE, _fake_checkpoint)
    assert latest_checkpoint(tmp_path) == target


def test_latest_checkpoint_skips_incomplete_dirs(tmp_path):
    for step in (2, 10, 4):
        write_atomically(checkpoint_dir(tmp_path, step).absolute(), SINGLE, _fake_checkpoint) if step != 2 else None
    checkpoint_dir(tmp_path, 2).mkdir()  # no state file: a crash before the rename cannot produce this, but be safe
    (tmp_path / "checkpoints" / ".step-12.tmp").mkdir()
    assert [step for step, _ in complete_checkpoints(tmp_path)] == [4, 10]
    assert latest_checkpoint(tmp_path) == checkpoint_dir(tmp_path, 10)
    assert prune_checkpoints(tmp_path, keep=1) == [checkpoint_dir(tmp_path, 4)]
    assert [step for step, _ in complete_checkpoints(tmp_path)] == [10]


def test_rl_iteration_checkpoints_use_their_own_prefix_and_marker(tmp_path):
    root = tmp_path / "checkpoints"
    for name, marker in [
        ("iter-3", "controller.pkl"),
        ("iter-7", "controller.pkl"),
        ("iter-9", None),
        ("step-5", None),
    ]:
        (root / name).mkdir(parents=True)
        if marker:
            (root / name / marker).write_bytes(b"")
    found = complete_checkpoints(tmp_path, "iter", ("controller.pkl",))
    assert [n for n, _ in found] == [3, 7]  # iter-9 has no state, step-5 is another prefix
    assert latest_checkpoint(tmp_path, "iter", ("controller.pkl",)) == root / "iter-7"
    assert prune_checkpoints(tmp_path, 1, "iter", ("controller.pkl",)) == [root / "iter-3"]
    assert complete_checkpoints(tmp_path) == []  # SFT's step-N needs trainer_state.json and engine/
