"""Sender + receiver in one process (receiver on a thread): round trips, zero-copy views, bad
metadata, checksum failures, timeouts, recovery. Fast; the multi-process tests are in
test_multiprocess.py."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from k2post_checkpoint_engine import (
    CheckpointEngineConfig,
    CheckpointEngineError,
    MetadataError,
    PeerTimeoutError,
    ReceiverError,
    Shard,
    WeightReceiver,
    WeightSender,
)
from k2post_checkpoint_engine.channel import Channel, accept, listen
from k2post_checkpoint_engine.errors import IntegrityError
from k2post_checkpoint_engine.shm import ShmSegment


class RxThread(threading.Thread):
    """Runs `n_updates` receiver updates on a thread, cloning what `load` gets, keeping errors."""

    def __init__(self, address: str, n_updates: int = 1, load_sleep_s: float = 0.0, **rx_kwargs) -> None:
        super().__init__(daemon=True)
        self.n_updates, self.load_sleep_s = n_updates, load_sleep_s
        self.updates: list[dict[str, torch.Tensor]] = []
        self.is_view: dict[str, bool] = {}
        self.exc: BaseException | None = None
        self.rx = WeightReceiver(address, self._load, **{"timeout_s": 10.0, **rx_kwargs})

    def _load(self, batch: list[tuple[str, torch.Tensor]]) -> None:
        slot_ptrs = {s.untyped_storage().data_ptr() for s in self.rx._slots}
        for name, t in batch:
            assert name not in self.updates[-1], f"{name} delivered twice"
            self.updates[-1][name] = t.clone()
            self.is_view[name] = t.untyped_storage().data_ptr() in slot_ptrs
        time.sleep(self.load_sleep_s)

    def run(self) -> None:
        try:
            for _ in range(self.n_updates):
                self.updates.append({})
                self.rx.run_update()
        except BaseException as e:
            self.exc = e
        finally:
            self.rx.close()


def _config(shm_prefix: str, **kw) -> CheckpointEngineConfig:
    return CheckpointEngineConfig(**{"bucket_nbytes": 4099, "timeout_s": 10.0, "shm_prefix": shm_prefix, **kw})


@pytest.mark.parametrize(
    "bucket_nbytes, cast, verify",
    [(64, None, True), (1000, None, False), (4099, "bfloat16", True), (1 << 20, None, True), (777, "float16", False)],
)
def test_roundtrip_bit_identical(workers, shm_prefix, bucket_nbytes, cast, verify):
    cfg = _config(shm_prefix, bucket_nbytes=bucket_nbytes, dtype=cast, verify_checksum=verify)
    with WeightSender(cfg) as sender:
        sources, zero3 = workers.build_sources(sender, 0, 1)
        rx = RxThread(sender.address, n_updates=3)
        rx.start()
        for u in range(3):
            workers.refresh(sources, zero3, u)
            stats = sender.push()
        rx.join(30)
    assert rx.exc is None, rx.exc
    for u, got in enumerate(rx.updates):
        exp = workers.expected_model(u, cast)
        assert sorted(got) == sorted(exp)
        bad = [n for n in exp if not workers.bitwise_equal(got[n], exp[n])]
        assert not bad, f"update {u}: mismatching tensors {bad}"
    assert stats.n_tensors == len(workers.MODEL) and stats.nbytes == sum(t.nbytes for t in exp.values())
    assert all(p.enters == p.exits == 3 for p in zero3.values())


def test_staging_pipeline_of_the_gpu_path_on_cpu(workers, shm_prefix):
    """The CUDA path stages each bucket in a separate buffer before the ack wait, then copies it
    into the slot; exercise that ordering on CPU by giving the sender a staging buffer."""
    with WeightSender(_config(shm_prefix, bucket_nbytes=1000, dtype="bfloat16")) as sender:
        sender._staging = torch.empty(sender.buffer_nbytes, dtype=torch.uint8)
        sources, zero3 = workers.build_sources(sender, 0, 1)
        rx = RxThread(sender.address, n_updates=2)
        rx.start()
        for u in range(2):
            workers.refresh(sources, zero3, u)
            sender.push()
        rx.join(30)
    assert rx.exc is None, rx.exc
    for u, got in enumerate(rx.updates):
        exp = workers.expected_model(u, "bfloat16")
        assert [n for n in exp if not workers.bitwise_equal(got[n], exp[n])] == []


def test_single_bucket_tensors_are_zero_copy_views_split_ones_are_reassembled(workers, shm_prefix):
    with WeightSender(_config(shm_prefix, bucket_nbytes=8192)) as sender:
        sources, zero3 = workers.build_sources(sender, 0, 1)
        workers.refresh(sources, zero3, 0)
        plan = sender.plan()
        rx = RxThread(sender.address)
        rx.start()
        sender.push()
        rx.join(30)
    assert rx.exc is None, rx.exc
    split = {t.name for b in plan for t in b.tensors if not t.is_whole}
    assert split == {"huge"}  # 3001 fp32 > 8192-byte bucket
    assert not rx.is_view["huge"]
    assert all(rx.is_view[n] for n in rx.is_view if n != "huge")


def test_sharded_sources_on_one_rank(shm_prefix):
    full = torch.arange(35, dtype=torch.float32).view(5, 7)
    with WeightSender(_config(shm_prefix, bucket_nbytes=64)) as sender:
        sender.register("w", Shard(full.reshape(-1)[:35].clone(), (5, 7), 0))
        sender.register("ctx", lambda: full, shape=(5, 7), dtype=torch.float32)  # plain callable
        rx = RxThread(sender.address)
        rx.start()
        sender.push()
        rx.join(30)
    assert rx.exc is None, rx.exc
    assert torch.equal(rx.updates[0]["w"], full) and torch.equal(rx.updates[0]["ctx"], full)


def test_expected_mismatch_rejected_on_both_sides(shm_prefix):
    with WeightSender(_config(shm_prefix)) as sender:
        sender.register("layers.0.w", torch.zeros(4, 4))
        rx = RxThread(sender.address, expected={"layers.0.w": ((4, 5), torch.float32)})
        rx.start()
        with pytest.raises(ReceiverError, match="'layers.0.w'.*shape"):
            sender.push()
        rx.join(10)
    assert isinstance(rx.exc, MetadataError) and "'layers.0.w'" in str(rx.exc)


def _damaged_push(shm_prefix, monkeypatch, damage) -> RxThread:
    """A push whose bucket bytes `damage(slot, plan)` corrupts after the sender filled them (a sender bug or a
    torn buffer): the receiver's error, and a receiver that does not verify."""
    real = WeightSender._fill_and_broadcast

    def fill(self, bucket, sources):
        digests = real(self, bucket, sources)
        damage(self._slots[bucket.buffer_slot], bucket)
        return digests

    monkeypatch.setattr(WeightSender, "_fill_and_broadcast", fill)
    with WeightSender(_config(shm_prefix, bucket_nbytes=1 << 16)) as sender:
        sender.register("a", torch.randn(64, 8))
        sender.register("b", torch.randn(64, 8))
        rx = RxThread(sender.address)
        rx.start()
        with pytest.raises(ReceiverError, match="digest"):
            sender.push()
        rx.join(10)
        unchecked = RxThread(sender.address, verify_checksum=False)  # switchable off: a new receiver accepts
        unchecked.start()
        sender.push()
        unchecked.join(10)
    damaged = [n for n in "ab" if not torch.equal(unchecked.updates[0][n], sender._regs[n].source)]
    assert unchecked.exc is None and damaged  # unverified, the damage would have been loaded
    return rx


def _pieces(bucket):
    return {t.name: (t.offset, t.offset + t.nbytes) for t in bucket.tensors}


def _flip(slot, bucket):
    start, _ = _pieces(bucket)["b"]
    slot[start + 5] ^= 1


def _swap(slot, bucket):
    (a0, a1), (b0, b1) = _pieces(bucket)["a"], _pieces(bucket)["b"]
    a_bytes = slot[a0:a1].clone()
    slot[a0:a1] = slot[b0:b1]
    slot[b0:b1] = a_bytes


def _move(slot, bucket):
    a0, a1 = _pieces(bucket)["a"]
    slot[a0:a1] = torch.roll(slot[a0:a1].clone(), 128)


@pytest.mark.parametrize(
    ("damage", "named"), [(_flip, "'b'"), (_swap, "'a'"), (_move, "'a'")], ids=["flip", "swap", "move"]
)
def test_damaged_bytes_are_caught_and_named(shm_prefix, monkeypatch, damage, named):
    rx = _damaged_push(shm_prefix, monkeypatch, damage)
    assert isinstance(rx.exc, IntegrityError) and f"tensor {named}" in str(rx.exc), rx.exc
    assert "the bytes that arrived are not the tensor that was sent" in str(rx.exc)


def test_load_failure_reported_then_recovery_with_new_receiver(shm_prefix):
    with WeightSender(_config(shm_prefix)) as sender:
        sender.register("w", torch.randn(10))

        def bad_load(batch):
            raise RuntimeError("engine rejected the weights")

        rx = WeightReceiver(sender.address, bad_load, timeout_s=10)
        t = threading.Thread(target=lambda: pytest.raises(RuntimeError, rx.run_update), daemon=True)
        t.start()
        with pytest.raises(ReceiverError, match="engine rejected the weights"):
            sender.push()
        t.join(10)
        rx2 = RxThread(sender.address, n_updates=2)
        rx2.start()
        sender.push()
        sender.push()
        rx2.join(10)
    assert rx2.exc is None and len(rx2.updates) == 2


def test_stuck_receiver_times_out(shm_prefix):
    with WeightSender(_config(shm_prefix, timeout_s=0.5, bucket_nbytes=64)) as sender:
        for i in range(4):
            sender.register(f"w{i}", torch.randn(16))
        rx = RxThread(sender.address, load_sleep_s=1.2)
        rx.start()
        sender.accept(timeout_s=10)
        t0 = time.monotonic()
        with pytest.raises(PeerTimeoutError, match="ack of bucket 0"):
            sender.push()
        assert time.monotonic() - t0 < 2.0
        rx.join(10)
    assert isinstance(rx.exc, CheckpointEngineError)


def test_empty_update(shm_prefix):
    with WeightSender(_config(shm_prefix)) as sender:
        rx = RxThread(sender.address)
        rx.start()
        stats = sender.push()
        rx.join(10)
    assert rx.exc is None and rx.updates == [{}] and (stats.nbytes, stats.n_buckets) == (0, 0)


def test_push_without_receiver_times_out(shm_prefix):
    with WeightSender(_config(shm_prefix, timeout_s=0.3)) as sender:
        sender.register("w", torch.zeros(3))
        with pytest.raises(PeerTimeoutError, match="no receiver for rank 0 connected"):
            sender.push()


def test_receiver_without_sender_times_out():
    with WeightSender(CheckpointEngineConfig()) as s:
        address = s.address  # a port that is closed once the sender is gone
    t0 = time.monotonic()
    with pytest.raises(PeerTimeoutError, match="could not connect"):
        WeightReceiver(address, lambda b: None, timeout_s=0.3).run_update()
    assert time.monotonic() - t0 < 2.0


def test_serve_until_sender_closes(shm_prefix):
    sender = WeightSender(_config(shm_prefix))
    sender.register("w", torch.ones(3))
    seen = []
    rx = WeightReceiver(sender.address, lambda b: seen.append(b[0][1].clone()), timeout_s=10)
    out: list = []
    t = threading.Thread(target=lambda: out.append(rx.serve()), daemon=True)
    t.start()
    for _ in range(3):
        sender.push()
    sender.close()
    t.join(10)
    assert len(out[0]) == 3 and len(seen) == 3


def _fake_sender(shm_prefix: str, plan: list[dict], result: dict) -> str:
    """Speak the sender protocol by hand and send `plan`; stores the receiver's reply in `result`."""
    listener = listen("127.0.0.1", 0)

    def serve() -> None:
        sock, _ = accept(listener, 10, "receiver")
        chan = Channel(sock, "test receiver")
        chan.recv(10, "hello")
        segs = [ShmSegment.create(shm_prefix, 1024 + 64) for _ in range(2)]
        chan.send({"t": "buffers", "kind": "shm", "names": [s.name for s in segs], "capacity_nbytes": 1024,
                   "buffer_nbytes": 1024 + 64, "rank": 0})  # fmt: skip
        chan.recv(10, "attached")
        for s in segs:
            s.close()
        chan.send(
            {"t": "begin", "update": 1, "n_buckets": len(plan), "plan_version": 1, "checksum": False, "plan": plan}
        )
        result["reply"] = chan.recv(10, "error")
        chan.close()
        listener.close()

    threading.Thread(target=serve, daemon=True).start()
    return "127.0.0.1:%d" % listener.getsockname()[1]


@pytest.mark.parametrize(
    "tensor, match",
    [
        (
            {"name": "w.overrun", "dtype": "float32", "shape": [300], "offset": 0, "nbytes": 1200, "start": 0},
            "'w.overrun'.*overrun",
        ),
        (
            {"name": "w.dtype", "dtype": "float13", "shape": [4], "offset": 0, "nbytes": 16, "start": 0},
            "'w.dtype'.*unknown dtype",
        ),
        (
            {"name": "w.short", "dtype": "float32", "shape": [8], "offset": 0, "nbytes": 16, "start": 0},
            "'w.short'.*cover 4 of 8",
        ),
    ],
)
def test_receiver_rejects_bad_metadata_from_sender(shm_prefix, tensor, match):
    result: dict = {}
    address = _fake_sender(
        shm_prefix, [{"index": 0, "owner": 0, "nbytes": tensor["nbytes"], "tensors": [tensor]}], result
    )
    loaded = []
    with pytest.raises(MetadataError, match=match):
        WeightReceiver(address, loaded.append, timeout_s=10).run_update()
    deadline = time.monotonic() + 10
    while "reply" not in result and time.monotonic() < deadline:
        time.sleep(0.01)
    assert result["reply"]["t"] == "error" and tensor["name"] in result["reply"]["message"]
    assert loaded == []


def test_sender_gone_mid_update_is_reported(shm_prefix):
    result: dict = {}
    plan = [{"index": 0, "owner": 0, "nbytes": 16, "tensors": [
        {"name": "w", "dtype": "float32", "shape": [4], "offset": 0, "nbytes": 16, "start": 0}]}]  # fmt: skip
    address = _fake_sender(shm_prefix, plan, result)  # sends begin, then waits; we never get bucket 0
    rx = WeightReceiver(address, lambda b: None, timeout_s=0.5)
    with pytest.raises(PeerTimeoutError, match="bucket 0"):
        rx.run_update()


def test_register_rejects_bad_sources(shm_prefix):
    with WeightSender(_config(shm_prefix), serve=False) as sender:
        with pytest.raises(ValueError, match="'s'.*exceed full shape"):
            sender.register("s", Shard(torch.zeros(5), (2, 2), 0))
        with pytest.raises(ValueError, match="'f'.*needs shape= and dtype="):
            sender.register("f", lambda: torch.zeros(2))
        with pytest.raises(TypeError, match="'x'"):
            sender.register("x", [1, 2, 3])
        with pytest.raises(ValueError, match="'o'.*owner 3"):
            sender.register("o", torch.zeros(1), owner=3)


def test_source_changed_after_registration_is_rejected(shm_prefix):
    with WeightSender(_config(shm_prefix), serve=False) as sender:
        w = torch.zeros(4)
        sender.register("w", w)
        sender.push()  # no receiver (serve=False): fills the buffers only
        w.data = torch.zeros(5)
        with pytest.raises(ValueError, match="'w'.*shape is now \\[5\\]"):
            sender.push()
        sender.register("w", w)  # re-registering with the new shape re-plans
        sender.register("m", lambda: torch.zeros(3), shape=(4,), dtype=torch.float32)
        with pytest.raises(ValueError, match="'m'.*shape is now \\[3\\]"):
            sender.push()
