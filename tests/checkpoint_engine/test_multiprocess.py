"""Multi-process tests (CPU, gloo): 1/2/4 sender ranks + receiver processes, a receiver killed or
frozen mid-update, and 100 updates in a row without memory or /dev/shm growth.

Workers are `tests/checkpoint_engine/_workers.py` subprocesses with hard timeouts; the tests only
ever signal pids they started. Run: `python -m pytest tests/checkpoint_engine -m slow -q`.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import pytest

from k2post_checkpoint_engine import CheckpointEngineConfig, PeerGoneError, PeerTimeoutError, WeightSender
from k2post_checkpoint_engine.shm import list_segments

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "world_size, serve_ranks, bucket_nbytes, cast",
    [(1, [0], 4099, None), (2, [0, 1], 4099, "bfloat16"), (4, [0, 3], 1000, None)],
)
def test_ranks_stream_bit_identical_tensors(
    launcher, tmp_path, shm_prefix, world_size, serve_ranks, bucket_nbytes, cast
):
    """Replicated, rank-exclusive, ZeRO-sharded and ZeRO-3-gathered sources; odd bucket sizes;
    tensors bigger than a bucket; 2 updates with different values; every receiver checks bitwise."""
    n_updates, port = 2, _free_port()
    config = {"bucket_nbytes": bucket_nbytes, "timeout_s": 30.0, "shm_prefix": shm_prefix, "dtype": cast}
    common = {"addr_dir": str(tmp_path), "n_updates": n_updates, "timeout_s": 30.0}
    senders = [
        launcher.start(
            "sender",
            {
                **common,
                "rank": r,
                "world_size": world_size,
                "master_port": port,
                "serve_ranks": serve_ranks,
                "config": config,
            },
        )  # fmt: skip
        for r in range(world_size)
    ]
    receivers = [launcher.start("receiver", {**common, "rank": r, "cast": cast}) for r in serve_ranks]
    launcher.wait([p for p, _ in senders + receivers], timeout_s=80)
    sender_results = [launcher.result(res) for _, res in senders]
    for _, res in receivers:
        out = launcher.result(res)
        assert out["updates"] == n_updates and out["mismatches"] == []
    assert all(r["zero3_balanced"] for r in sender_results)
    assert len({r["plan_json"] for r in sender_results}) == 1  # the same plan on every rank
    assert len({tuple(map(tuple, r["stats"])) for r in sender_results}) == 1
    assert list_segments(shm_prefix) == []


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP])
def test_receiver_killed_or_frozen_mid_update(launcher, workers, tmp_path, shm_prefix, sig):
    """SIGKILL: the sender raises PeerGoneError at once; SIGSTOP: PeerTimeoutError within timeout_s.
    Either way no shm segment is left behind."""
    timeout_s = 2.0
    cfg = CheckpointEngineConfig(bucket_nbytes=1024, timeout_s=timeout_s, shm_prefix=shm_prefix, verify_checksum=False)
    marker = tmp_path / "in_load"
    with WeightSender(cfg) as sender:
        sources, zero3 = workers.build_sources(sender, 0, 1)
        workers.refresh(sources, zero3, 0)
        (tmp_path / "addr0").write_text(sender.address)
        proc, _ = launcher.start("receiver", {"addr_dir": str(tmp_path), "rank": 0, "n_updates": 1, "timeout_s": 30.0,
                                              "marker": str(marker), "hang_s": 60})  # fmt: skip
        sender.accept(timeout_s=30)
        assert list_segments(shm_prefix) == []  # names are unlinked as soon as the receiver mapped them

        def kill_when_loading() -> None:
            deadline = time.monotonic() + 30
            while not marker.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            os.kill(proc.pid, sig)

        killer = threading.Thread(target=kill_when_loading, daemon=True)
        killer.start()
        t0 = time.monotonic()
        expected = PeerGoneError if sig == signal.SIGKILL else PeerTimeoutError
        with pytest.raises(expected, match="receiver pid"):
            sender.push()
        elapsed = time.monotonic() - t0
        killer.join(5)
        assert marker.exists()
    assert elapsed < timeout_s + 3.0
    if sig == signal.SIGSTOP:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    assert list_segments(shm_prefix) == []


def test_100_updates_no_growth(launcher, tmp_path, shm_prefix):
    n, probes = 100, [9, 99]
    config = {"bucket_nbytes": 256 << 10, "timeout_s": 30.0, "shm_prefix": shm_prefix}
    common = {"addr_dir": str(tmp_path), "n_updates": n, "timeout_s": 30.0, "probe_updates": probes,
              "bulk_numel": 1 << 18}  # + a 1 MiB tensor split over buckets: any per-update leak shows  # fmt: skip
    sender, s_res = launcher.start("sender", {**common, "rank": 0, "world_size": 1, "master_port": 0,
                                             "serve_ranks": [0], "config": config})  # fmt: skip
    receiver, r_res = launcher.start("receiver", {**common, "rank": 0})
    launcher.wait([sender, receiver], timeout_s=80)
    s_out, r_out = launcher.result(s_res), launcher.result(r_res)
    assert r_out["updates"] == n and r_out["mismatches"] == []
    assert s_out["shm"] == [[], []]  # no named segment while running (unlinked after the handshake)
    growth_mib = {k: (v["rss"][1] - v["rss"][0]) / 2**20 for k, v in {"sender": s_out, "receiver": r_out}.items()}
    print(f"RSS growth over 90 updates (MiB): {growth_mib}")
    assert all(g < 4.0 for g in growth_mib.values()), f"RSS growth over 90 updates: {growth_mib}"
    assert list_segments(shm_prefix) == []
