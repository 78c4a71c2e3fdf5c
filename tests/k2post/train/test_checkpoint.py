"""Checkpoint dirs: atomic publish (no partial dir after a crash), newest complete one, pruning."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from k2post.train.checkpoint import (
    ENGINE_DIR,
    STATE_FILE,
    DiskFullError,
    checkpoint_dir,
    complete_checkpoints,
    is_disk_full,
    latest_checkpoint,
    prune_checkpoints,
    write_atomically,
)
from k2post.command import UserError
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


# --------------------------------------------------------------------------- a full disk


@pytest.mark.parametrize(
    ("err", "free", "full"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), 10 << 30, True),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), 10 << 30, True),
        (
            RuntimeError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "..." })'),
            None,
            True,
        ),
        (RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed"), 1 << 20, True),
        (RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed"), 10 << 30, False),
        (OSError(errno.EACCES, "Permission denied"), 10 << 30, False),
        (ValueError("bad tensor"), 0, False),  # not an I/O failure, however full the disk is
    ],
)
def test_is_disk_full(err, free, full):
    assert is_disk_full(err, free) is full


def test_is_disk_full_reads_the_cause_chain():
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("save failed") from inner
    except RuntimeError as outer:
        assert is_disk_full(outer, 10 << 30)


def test_a_full_disk_is_one_line_naming_the_run_dir_and_keeps_the_previous_checkpoint(tmp_path):
    """At the save seam a write raises OSError(ENOSPC): DiskFullError names the run dir, no partial dir or temp is
    left, step-3 stays the newest complete checkpoint (was: the torch / OSError traceback)."""
    write_atomically(checkpoint_dir(tmp_path, 3), SINGLE, _fake_checkpoint)

    def full(tmp: Path) -> None:
        (tmp / ENGINE_DIR).mkdir()
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(DiskFullError) as err:
        write_atomically(checkpoint_dir(tmp_path, 6), SINGLE, full)
    assert str(err.value).startswith(f"no space left on the device of run dir {tmp_path}: checkpoint step-6 was not")
    assert "\n" not in str(err.value) and isinstance(err.value, UserError)
    assert latest_checkpoint(tmp_path) == checkpoint_dir(tmp_path, 3)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-3"]


def test_rl_checkpoint_on_a_full_disk(tmp_path, monkeypatch):
    """The RL controller's iter-N save: the trainers' save runs out of disk -> DiskFullError, partial dir removed."""
    from k2post.rl.state import ControllerState

    class FullTrainers:
        def save(self, path: str) -> None:
            (Path(path) / "engine").mkdir()
            raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")

    monkeypatch.setattr("k2post.train.checkpoint.free_bytes", lambda path: 1 << 20)
    with pytest.raises(DiskFullError, match=f"run dir {tmp_path}: checkpoint iter-2 was not written"):
        ControllerState.fresh(2).save(tmp_path, 2, FullTrainers(), None, keep=2)
    assert list((tmp_path / "checkpoints").iterdir()) == []
