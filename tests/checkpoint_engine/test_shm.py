"""POSIX shm segments: create/attach/unlink, cleanup on SIGTERM, stale sweep after SIGKILL."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch

from k2post_checkpoint_engine import CheckpointEngineConfig, WeightSender
from k2post_checkpoint_engine.errors import CheckpointEngineError
from k2post_checkpoint_engine.shm import SHM_DIR, ShmSegment, list_segments, sweep_stale_segments


def test_create_attach_share_and_unlink(shm_prefix):
    seg = ShmSegment.create(shm_prefix, 4096)
    assert seg.name.startswith(f"{shm_prefix}-{os.getpid()}-") and list_segments(shm_prefix) == [seg.name]
    peer = ShmSegment.attach(seg.name, 4096)
    seg.tensor[:8] = torch.arange(8, dtype=torch.uint8)
    assert peer.tensor[:8].tolist() == list(range(8))
    peer.close()  # an attacher never unlinks
    assert list_segments(shm_prefix) == [seg.name]
    view = seg.tensor[:16]
    seg.unlink()  # name gone, mapping still usable
    assert list_segments(shm_prefix) == []
    view[0] = 7
    seg.close()  # a live view keeps the mapping alive
    assert view[0] == 7


def test_attach_errors(shm_prefix):
    with pytest.raises(CheckpointEngineError, match="does not exist"):
        ShmSegment.attach(f"{shm_prefix}-1-abc", 64)
    with pytest.raises(CheckpointEngineError, match="unexpected name"):
        ShmSegment.attach("../etc/passwd", 64)
    seg = ShmSegment.create(shm_prefix, 64)
    with pytest.raises(CheckpointEngineError, match="has 64 bytes, expected 128"):
        ShmSegment.attach(seg.name, 128)
    seg.close()


def test_dropped_segment_is_unlinked_by_finalizer(shm_prefix):
    seg = ShmSegment.create(shm_prefix, 64)
    del seg
    assert list_segments(shm_prefix) == []


def _dead_pid() -> int:
    pid = 4_194_000
    while True:  # find a pid that is not running
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid += 1


def test_sweep_only_removes_dead_creators(shm_prefix):
    mine = ShmSegment.create(shm_prefix, 64)
    stale = Path(SHM_DIR, f"{shm_prefix}-{_dead_pid()}-deadbeef")
    stale.write_bytes(b"x" * 64)
    assert sweep_stale_segments(shm_prefix) == [stale.name]
    assert list_segments(shm_prefix) == [mine.name]
    mine.close()


def test_sender_start_sweeps_stale_segments(shm_prefix):
    stale = Path(SHM_DIR, f"{shm_prefix}-{_dead_pid()}-0123abcd")
    stale.write_bytes(b"x" * 64)
    WeightSender(CheckpointEngineConfig(shm_prefix=shm_prefix), serve=False).close()
    assert not stale.exists()


def _wait_for(path: Path, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)
    return path.read_text()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_creator_killed(launcher, tmp_path, shm_prefix, sig):
    """SIGTERM/SIGINT: the creator's handler unlinks. SIGKILL: the next sweep does."""
    name_file = tmp_path / "name"
    proc, _ = launcher.start("shm_holder", {"prefix": shm_prefix, "name_file": str(name_file), "sleep_s": 60})
    name = _wait_for(name_file, 30)
    assert list_segments(shm_prefix) == [name]
    os.kill(proc.pid, sig)
    proc.wait(10)
    if sig == signal.SIGKILL:
        assert list_segments(shm_prefix) == [name]
        assert sweep_stale_segments(shm_prefix) == [name]
    assert list_segments(shm_prefix) == []
