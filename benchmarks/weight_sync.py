"""Benchmark: checkpoint-engine weight push (trainer -> inference process) vs memcpy, disk, per-tensor broadcast.

Run: `python benchmarks/weight_sync.py [--gb 2.0] [--bucket-mib 256] [--repeats 3] [--quick]`
(from the repo root; `--quick` = ~0.3 GB, 2 repeats, for smoke tests; a full run took ~80 s on the 2-core dev box).

Payload: bf16 tensors of a 7B-class decoder in checkpoint order (embeddings [32000, 4096]; per layer
q/o [4096, 4096], k/v [1024, 4096], gate/up [11008, 4096], down [4096, 11008], two norms [4096]) until
>= --gb * 1e9 bytes. A trainer process (rank 0, random weights) pushes them to a receiver process
(rank 1) that copies them into preallocated tensors. Methods, all in the same run:

- memcpy: `copy_` of the same tensors into preallocated twins in ONE process, with 1 torch thread
  (`memcpy_gbps`: one copy stream), with the default torch threads (`memcpy_all_threads_gbps`), and as
  two Python threads of 1 torch thread each. The engine on CPU copies every byte twice (trainer ->
  shm IPC buffer, shm -> receiver tensors) in two processes that run in parallel, one core each, so
  one copy stream is the most each pipeline stage can reach; a multi-threaded copy_ puts both cores
  on one copy, which the engine cannot match (`ratio_vs_memcpy_all_threads` reports it anyway).
- the checkpoint engine (`checkpoint_engine.WeightSender` -> `WeightReceiver`, CPU/shm, no checksum),
  `--engine-threads` torch threads per worker (default 1: one core per stage); headline bucket
  `--bucket-mib`, plus a sweep (`--sweep-mib`) and the headline bucket at the default thread count.
- disk: `safetensors.torch.save_file` in the trainer (a fresh file under runs/, on the real disk),
  then `safe_open` + `copy_` into the preallocated tensors in the receiver. Nothing is dropped from
  the page cache and there is no fsync, so the load reads memory: an optimistic disk path. A cold
  variant (`disk_cold_gbps`, median of --repeats) fsyncs after the save and evicts the file from the
  page cache (posix_fadvise DONTNEED) so the load really reads the disk.
- one `torch.distributed.broadcast` per tensor (gloo, trainer rank 0 -> receiver rank 1), no bucketing.
- per-tensor overhead: `--small-tensors` bf16 [64, 64] tensors through the engine and through gloo.

Engine, disk and broadcast runs are interleaved (order rotates), median of --repeats after 1 warm-up.
Every method's result is checked outside the timing: the receiver's tensors are zeroed before that
method's (check or sweep) runs, then their per-tensor CRC32s must equal the trainer's. Prints markdown
tables, then exactly one JSON line:
{"bytes": .., "engine_gbps": .., "memcpy_gbps": .., "disk_gbps": .., "per_tensor_bcast_gbps": ..,
 "ratio_vs_memcpy": .., "speedup_vs_disk": .., "memcpy_all_threads_gbps": ..,
 "ratio_vs_memcpy_all_threads": .., ...}
Workers are spawned (multiprocessing "spawn"), every wait has a timeout, and the work directory under
runs/ and this run's shm segments are removed at the end.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import traceback
import zlib
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # spawned children import this file by path; make `checkpoint_engine` importable
    sys.path.insert(0, str(ROOT))

# 7B-class decoder (Llama-2-7B widths, GQA k/v as in the issue): hidden 4096, 8 kv heads of 128, MLP 11008, vocab 32000.
HIDDEN, KV, MLP, VOCAB = 4096, 1024, 11008, 32000
WORKER_TIMEOUT_S = 60.0  # what the workers give the engine / gloo for any handshake, ack or collective
STEP_TIMEOUT_S = 120.0  # any single worker command (one push, one save, one load) must answer within this
START_TIMEOUT_S = 180.0  # worker start-up: import torch + fill the tensors


def model_shapes(target_bytes: int) -> list[tuple[str, tuple[int, ...]]]:
    """HF-Llama-named bf16 tensors of a 7B-class model, in checkpoint order, until >= target_bytes."""

    def stream():
        yield "model.embed_tokens.weight", (VOCAB, HIDDEN)
        layer = 0
        while True:
            p = f"model.layers.{layer}."
            yield p + "input_layernorm.weight", (HIDDEN,)
            yield p + "self_attn.q_proj.weight", (HIDDEN, HIDDEN)
            yield p + "self_attn.k_proj.weight", (KV, HIDDEN)
            yield p + "self_attn.v_proj.weight", (KV, HIDDEN)
            yield p + "self_attn.o_proj.weight", (HIDDEN, HIDDEN)
            yield p + "post_attention_layernorm.weight", (HIDDEN,)
            yield p + "mlp.gate_proj.weight", (MLP, HIDDEN)
            yield p + "mlp.up_proj.weight", (MLP, HIDDEN)
            yield p + "mlp.down_proj.weight", (HIDDEN, MLP)
            layer += 1

    out, total = [], 0
    for name, shape in stream():
        out.append((name, shape))
        total += 2 * _numel(shape)
        if total >= target_bytes:
            return out
    raise AssertionError("unreachable")


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _crcs(tensors: list[torch.Tensor]) -> list[int]:
    return [zlib.crc32(t.view(torch.uint8).reshape(-1).numpy()) for t in tensors]


# ----------------------------------------------------------------------------------------------------------------------
# (a) memcpy in this process
# ----------------------------------------------------------------------------------------------------------------------


def bench_memcpy(shapes, repeats: int) -> dict[str, float]:
    """Median seconds to copy_ every tensor into a preallocated twin: 1 torch thread, default threads, 2 py threads."""
    default_threads = torch.get_num_threads()
    gen = torch.Generator().manual_seed(1)
    src = [torch.empty(s, dtype=torch.bfloat16).normal_(generator=gen) for _, s in shapes]
    dst = [torch.zeros_like(t) for t in src]

    def one_stream(pairs):
        for s, d in pairs:
            d.copy_(s)

    # Two Python threads at 1 torch thread each (copy_ releases the GIL): "one copy_ per core".
    pairs = list(zip(src, dst))
    halves, acc = ([], []), [0, 0]
    for s, d in sorted(pairs, key=lambda p: -p[0].nbytes):  # greedy balance of bytes between the two threads
        i = 0 if acc[0] <= acc[1] else 1
        halves[i].append((s, d))
        acc[i] += s.nbytes

    def two_py_threads():
        ths = [threading.Thread(target=one_stream, args=(h,)) for h in halves]
        for t in ths:
            t.start()
        for t in ths:
            t.join()

    variants = {
        "memcpy_1thread_s": (1, lambda: one_stream(pairs)),
        "memcpy_all_threads_s": (default_threads, lambda: one_stream(pairs)),
        "memcpy_2pythreads_s": (1, two_py_threads),
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    for key, (nthreads, fn) in variants.items():  # warm-up (also faults in dst pages, though zeros_like already did)
        torch.set_num_threads(nthreads)
        fn()
    for i in range(repeats):  # interleaved, order rotates
        keys = list(variants)
        keys = keys[i % len(keys) :] + keys[: i % len(keys)]
        for key in keys:
            nthreads, fn = variants[key]
            torch.set_num_threads(nthreads)
            start = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - start)
    torch.set_num_threads(default_threads)
    ok = all(torch.equal(s.view(torch.int16), d.view(torch.int16)) for s, d in pairs)
    out = {k: statistics.median(v) for k, v in times.items()}
    out["memcpy_identical"] = ok
    out["default_threads"] = default_threads
    return out


# ----------------------------------------------------------------------------------------------------------------------
# Worker processes: rank 0 = trainer (owns the weights), rank 1 = receiver (preallocated tensors).
# ----------------------------------------------------------------------------------------------------------------------


class _Worker:
    def __init__(self, rank: int, shapes, workdir: str, store_name: str):
        self.rank, self.shapes, self.workdir, self.store_name = rank, shapes, Path(workdir), store_name
        self.names = [n for n, _ in shapes]
        if rank == 0:
            gen = torch.Generator().manual_seed(0)
            self.tensors = [torch.empty(s, dtype=torch.bfloat16).normal_(generator=gen).mul_(0.02) for _, s in shapes]
        else:
            self.tensors = [torch.zeros(s, dtype=torch.bfloat16) for _, s in shapes]
        self.by_name = dict(zip(self.names, self.tensors))
        self.pg_ready = False

    # --- bookkeeping -------------------------------------------------------------------------------------------------
    def cmd_crc(self):
        return _crcs(self.tensors)

    def cmd_zero(self):
        for t in self.tensors:
            t.zero_()

    # --- (b) disk ----------------------------------------------------------------------------------------------------
    def cmd_disk_save(self, path: str, fsync: bool = False):
        from safetensors.torch import save_file

        if os.path.exists(path):
            os.remove(path)  # a fresh checkpoint every step, as a naive pipeline writes
        t0 = time.perf_counter()
        save_file(self.by_name, path)
        if fsync:  # cold variant: the bytes reach the disk and leave the page cache before the load
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # evict: the load then reads the disk
            finally:
                os.close(fd)
        return t0, time.perf_counter()

    def cmd_disk_load(self, path: str):
        from safetensors import safe_open

        t0 = time.perf_counter()
        with safe_open(path, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                self.by_name[name].copy_(f.get_tensor(name))
        return t0, time.perf_counter()

    # --- (c) one gloo broadcast per tensor ---------------------------------------------------------------------------
    def _pg(self):
        import torch.distributed as dist

        if not self.pg_ready:
            dist.init_process_group(
                "gloo",
                init_method=f"file://{self.workdir / self.store_name}",
                rank=self.rank,
                world_size=2,
                timeout=datetime.timedelta(seconds=WORKER_TIMEOUT_S),
            )
            self.pg_ready = True
        return dist

    def cmd_bcast(self):
        dist = self._pg()
        dist.barrier()
        t0 = time.perf_counter()
        for t in self.tensors:
            dist.broadcast(t, src=0)
        return t0, time.perf_counter()

    # --- the checkpoint engine: WeightSender (rank 0) -> WeightReceiver (rank 1), POSIX shm buffers -----------------
    def cmd_threads(self, n: int):
        torch.set_num_threads(n)

    def cmd_engine_open(self, bucket_nbytes: int, shm_prefix: str):
        from k2post_checkpoint_engine import CheckpointEngineConfig, WeightSender

        cfg = CheckpointEngineConfig(
            bucket_nbytes=bucket_nbytes, verify_checksum=False, timeout_s=WORKER_TIMEOUT_S, shm_prefix=shm_prefix
        )
        self.sender = WeightSender(cfg)
        for name, t in zip(self.names, self.tensors):
            self.sender.register(name, t)
        return self.sender.address, len(self.sender.plan())

    def cmd_engine_accept(self):
        self.sender.accept(timeout_s=WORKER_TIMEOUT_S)

    def _load(self, batch):  # the inference side's `load`: copy the zero-copy shm views into our own tensors
        for name, t in batch:
            self.by_name[name].copy_(t)

    def cmd_engine_connect(self, address: str):
        from k2post_checkpoint_engine import WeightReceiver

        self.receiver = WeightReceiver(address, self._load, timeout_s=WORKER_TIMEOUT_S, verify_checksum=False)
        self.receiver.connect()

    def cmd_engine_push(self):
        t0 = time.perf_counter()
        stats = self.sender.push()
        return (
            t0,
            time.perf_counter(),
            {
                "n_buckets": stats.n_buckets,
                "elapsed_s": stats.elapsed_s,
                "ack_wait_s": stats.ack_wait_s,
                "nbytes": stats.nbytes,
            },
        )

    def cmd_engine_recv(self):
        t0 = time.perf_counter()
        stats = self.receiver.run_update(wait_s=WORKER_TIMEOUT_S)
        return (
            t0,
            time.perf_counter(),
            {
                "n_buckets": stats.n_buckets,
                "elapsed_s": stats.elapsed_s,
                "load_s": stats.load_s,
                "nbytes": stats.nbytes,
            },
        )

    def cmd_engine_close(self):
        for attr in ("sender", "receiver"):
            obj = getattr(self, attr, None)
            if obj is not None:
                obj.close()
                setattr(self, attr, None)

    def close(self):
        self.cmd_engine_close()
        if self.pg_ready:
            import torch.distributed as dist

            dist.destroy_process_group()


def _worker_main(rank: int, shapes, workdir: str, store_name: str, conn) -> None:
    try:
        w = _Worker(rank, shapes, workdir, store_name)
        conn.send(("ok", "ready"))
        while True:
            cmd, args = conn.recv()
            if cmd == "exit":
                w.close()
                conn.send(("ok", None))
                return
            try:
                conn.send(("ok", getattr(w, "cmd_" + cmd)(*args)))
            except Exception:
                conn.send(("err", traceback.format_exc()))
    except Exception:
        try:
            conn.send(("err", traceback.format_exc()))
        except Exception:
            pass


class _Pair:
    """The trainer and receiver processes, driven over pipes; every wait has a timeout."""

    def __init__(self, shapes, workdir: Path):
        ctx = mp.get_context("spawn")
        self.procs, self.conns = [], []
        store_name = f"gloo_store_{os.getpid()}_{time.monotonic_ns()}"  # a fresh FileStore per pair
        for rank in (0, 1):
            parent, child = ctx.Pipe()
            p = ctx.Process(
                target=_worker_main,
                args=(rank, shapes, str(workdir), store_name, child),
                daemon=True,
                name=f"weight_sync_rank{rank}",
            )
            p.start()
            self.procs.append(p)
            self.conns.append(parent)
        for rank in (0, 1):
            self._recv(rank, START_TIMEOUT_S)

    def _recv(self, rank: int, timeout: float):
        if not self.conns[rank].poll(timeout):
            raise TimeoutError(f"rank {rank} did not answer within {timeout:.0f} s")
        status, value = self.conns[rank].recv()
        if status != "ok":
            raise RuntimeError(f"rank {rank} failed:\n{value}")
        return value

    def send(self, rank: int, cmd: str, *args) -> None:
        self.conns[rank].send((cmd, args))

    def call(self, rank: int, cmd: str, *args, timeout: float = STEP_TIMEOUT_S):
        self.send(rank, cmd, *args)
        return self._recv(rank, timeout)

    def call_both(self, cmds: tuple, timeout: float = STEP_TIMEOUT_S):
        """Send (cmd, args) to rank 0 and rank 1 at once; wait for both."""
        for rank, (cmd, args) in enumerate(cmds):
            self.send(rank, cmd, *args)
        return [self._recv(rank, timeout) for rank in (0, 1)]

    def close(self) -> None:
        for rank, p in enumerate(self.procs):
            if p.is_alive():
                try:
                    self.call(rank, "exit", timeout=20)
                except Exception:
                    pass
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()  # only our own spawned children
                p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)


def _median(xs):
    return statistics.median(xs)


class Bench:
    """One trainer/receiver pair; each `run_*` does one transfer and returns its seconds (from the workers' clocks)."""

    def __init__(self, pair: _Pair, workdir: Path, default_threads: int):
        self.pair, self.workdir, self.default_threads = pair, workdir, default_threads
        self.path = str(workdir / "model.safetensors")
        self.ref_crcs = pair.call(0, "crc", timeout=300)
        self.engine_threads = default_threads

    def threads(self, n: int) -> None:
        self.pair.call(0, "threads", n)
        self.pair.call(1, "threads", n)

    # (b) safetensors: save in the trainer, then load in the receiver into its preallocated tensors
    def run_disk(self, fsync: bool = False) -> dict:
        s0, s1 = self.pair.call(0, "disk_save", self.path, fsync)
        l0, l1 = self.pair.call(1, "disk_load", self.path)
        return {"s": (s1 - s0) + (l1 - l0), "save_s": s1 - s0, "load_s": l1 - l0}

    # (c) one gloo broadcast per tensor
    def run_bcast(self) -> dict:
        (t0, _), (_, r1) = self.pair.call_both((("bcast", ()), ("bcast", ())))
        return {"s": r1 - t0}  # trainer's start (after a barrier) to the receiver holding the last tensor

    # the engine
    def engine_open(self, bucket_nbytes: int, shm_prefix: str, threads: int) -> int:
        address, n_buckets = self.pair.call(0, "engine_open", bucket_nbytes, shm_prefix)
        self.pair.call_both((("engine_accept", ()), ("engine_connect", (address,))))
        self.engine_threads = threads
        return n_buckets

    def run_engine(self) -> dict:
        self.threads(self.engine_threads)  # set outside the timed region; restored for the other methods
        try:
            (p0, p1, ps), (_, r1, rs) = self.pair.call_both((("engine_push", ()), ("engine_recv", ())))
        finally:
            self.threads(self.default_threads)
        assert ps["nbytes"] == rs["nbytes"], (ps, rs)
        return {
            "s": max(p1, r1) - p0,
            "n_buckets": ps["n_buckets"],
            "push_elapsed_s": ps["elapsed_s"],
            "ack_wait_s": ps["ack_wait_s"],
            "load_s": rs["load_s"],
        }

    def engine_close(self) -> None:
        self.pair.call(0, "engine_close")
        self.pair.call(1, "engine_close")

    def identical(self) -> bool:
        return self.pair.call(1, "crc", timeout=300) == self.ref_crcs

    def verify(self, run) -> bool:
        """Zero the receiver, run one (untimed) transfer, compare per-tensor CRC32s with the trainer's."""
        self.pair.call(1, "zero")
        run()
        return self.identical()


def _summary(runs: list[dict]) -> dict:
    """Median of every numeric field over the timed runs."""
    return {k: _median([r[k] for r in runs]) for k in runs[0]}


def bench_pipelines(
    pair: _Pair,
    workdir: Path,
    engine_cfgs: list[tuple[int, int]],
    repeats: int,
    shm_prefix: str,
    default_threads: int,
    fsync_row: bool,
) -> dict:
    """engine_cfgs: [(bucket_nbytes, torch threads per worker)], the first is the headline (interleaved with
    disk and broadcast); the others run the engine alone afterwards."""
    b = Bench(pair, workdir, default_threads)
    out: dict = {"engine_cfgs": []}
    n_buckets = b.engine_open(engine_cfgs[0][0], shm_prefix, engine_cfgs[0][1])
    runs = {"engine": b.run_engine, "disk": b.run_disk, "bcast": b.run_bcast}
    timed: dict[str, list[dict]] = {k: [] for k in runs}
    for fn in runs.values():  # warm-up: page faults in shm, gloo connection, first file
        fn()
    for i in range(repeats):  # interleaved, order rotates (the box is shared and noisy)
        keys = list(runs)
        keys = keys[i % 3 :] + keys[: i % 3]
        for k in keys:
            timed[k].append(runs[k]())
    for k in runs:
        out[k] = _summary(timed[k])
        out[k]["identical"] = b.verify(runs[k])
    out["engine"].update(plan_buckets=n_buckets, bucket_nbytes=engine_cfgs[0][0], threads=engine_cfgs[0][1])
    out["engine_cfgs"].append(out["engine"])
    b.engine_close()
    for size, threads in engine_cfgs[1:]:  # the engine alone at other bucket sizes / thread counts
        n_buckets = b.engine_open(size, shm_prefix, threads)
        pair.call(1, "zero")
        res = _summary(_timed(repeats, 1, b.run_engine))
        res.update(identical=b.identical(), plan_buckets=n_buckets, bucket_nbytes=size, threads=threads)
        out["engine_cfgs"].append(res)
        b.engine_close()
    if fsync_row:  # cold disk: save + fsync + evict from the page cache + load (median of `repeats`)
        pair.call(1, "zero")
        out["disk_fsync"] = _summary(_timed(repeats, 0, lambda: b.run_disk(fsync=True)))
        out["disk_fsync"]["identical"] = b.identical()
    if os.path.exists(b.path):
        os.remove(b.path)
    return out


def bench_small(
    workdir: Path, n_tensors: int, repeats: int, shm_prefix: str, engine_threads: int, default_threads: int
) -> dict:
    """Per-tensor overhead: `n_tensors` bf16 [64, 64] tensors (8 KiB each) through the engine (one 256 MiB
    bucket) and through one gloo broadcast per tensor; the bytes are negligible, the count is not."""
    shapes = [(f"small.{i}.weight", (64, 64)) for i in range(n_tensors)]
    pair = _Pair(shapes, workdir)
    try:
        b = Bench(pair, workdir, default_threads)
        n_buckets = b.engine_open(256 << 20, shm_prefix, engine_threads)
        pair.call(1, "zero")
        eng = _summary(_timed(repeats, 1, b.run_engine))
        eng.update(identical=b.identical(), plan_buckets=n_buckets)
        b.engine_close()
        pair.call(1, "zero")
        bcast = _summary(_timed(repeats, 1, b.run_bcast))
        bcast["identical"] = b.identical()
    finally:
        pair.close()
    return {"n_tensors": n_tensors, "nbytes": n_tensors * 64 * 64 * 2, "engine": eng, "bcast": bcast}


def _timed(repeats: int, warmup: int, fn) -> list[float]:
    for _ in range(warmup):
        fn()
    return [fn() for _ in range(repeats)]


def bench_disk(pair: _Pair, workdir: Path, repeats: int) -> dict:
    path = str(workdir / "model.safetensors")
    saves, loads = [], []

    def one():
        s0, s1 = pair.call(0, "disk_save", path)
        l0, l1 = pair.call(1, "disk_load", path)
        saves.append(s1 - s0)
        loads.append(l1 - l0)
        return (s1 - s0) + (l1 - l0)

    totals = _timed(repeats, 1, one)
    saves, loads = saves[1:], loads[1:]
    os.remove(path)
    return {
        "disk_s": statistics.median(totals),
        "disk_save_s": statistics.median(saves),
        "disk_load_s": statistics.median(loads),
    }


def bench_bcast(pair: _Pair, repeats: int) -> dict:
    def one():
        (t0, _), (_, r1) = pair.call_both((("bcast", ()), ("bcast", ())))
        return r1 - t0  # trainer's start (after a barrier) to the receiver holding the last tensor

    return {"per_tensor_bcast_s": statistics.median(_timed(repeats, 1, one))}


def _fmt_yes(ok: bool) -> str:
    return "yes" if ok else "**NO**"


def _figures(nbytes: int, args, mem: dict, res: dict) -> dict:
    """The JSON figures (rounded)."""
    gb = nbytes / 1e9
    eng, disk, bcast = res["engine"], res["disk"], res["bcast"]
    m1, mall, m2py = mem["memcpy_1thread_s"], mem["memcpy_all_threads_s"], mem["memcpy_2pythreads_s"]

    def rate(sec: float) -> float:
        return gb / sec

    def cfg_key(r: dict) -> str:
        return f"{r['bucket_nbytes'] >> 20}MiB_{r['threads']}thr"

    identical = [mem["memcpy_identical"], disk["identical"], bcast["identical"]] + [
        r["identical"] for r in res["engine_cfgs"]
    ]
    figures = {
        "bytes": nbytes,
        "engine_gbps": rate(eng["s"]),
        "memcpy_gbps": rate(m1),
        "disk_gbps": rate(disk["s"]),
        "per_tensor_bcast_gbps": rate(bcast["s"]),
        "ratio_vs_memcpy": m1 / eng["s"],
        "speedup_vs_disk": disk["s"] / eng["s"],
        "memcpy_all_threads_gbps": rate(mall),
        "ratio_vs_memcpy_all_threads": mall / eng["s"],
        "memcpy_2pythreads_gbps": rate(m2py),
        "speedup_vs_per_tensor_bcast": bcast["s"] / eng["s"],
        "disk_save_gbps": rate(disk["save_s"]),
        "disk_load_gbps": rate(disk["load_s"]),
        "bucket_mib": eng["bucket_nbytes"] >> 20,
        "n_buckets": int(eng["n_buckets"]),
        "engine_threads_per_process": eng["threads"],
        "engine_s_per_push": eng["s"],
        "engine_receiver_load_gbps": rate(eng["load_s"]),
        "engine_gbps_by_config": {cfg_key(r): round(rate(r["s"]), 3) for r in res["engine_cfgs"]},
        "engine_s_by_config": {cfg_key(r): round(r["s"], 4) for r in res["engine_cfgs"]},
        "bit_identical": bool(all(identical)),
        "repeats": args.repeats,
    }
    if "small" in res:
        sm = res["small"]
        figures["engine_us_per_tensor"] = sm["engine"]["s"] / sm["n_tensors"] * 1e6
        figures["per_tensor_bcast_us_per_tensor"] = sm["bcast"]["s"] / sm["n_tensors"] * 1e6
        identical += [sm["engine"]["identical"], sm["bcast"]["identical"]]
        figures["bit_identical"] = bool(all(identical))
    if "disk_fsync" in res:
        identical.append(res["disk_fsync"]["identical"])
        figures["bit_identical"] = bool(all(identical))
        figures["disk_cold_gbps"] = rate(res["disk_fsync"]["s"])
        figures["speedup_vs_disk_cold"] = res["disk_fsync"]["s"] / eng["s"]
    figures = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in figures.items()}
    return figures


def _print_main_table(nbytes: int, n_tensors: int, args, mem: dict, res: dict) -> None:
    """Header and the per-method table."""
    gb = nbytes / 1e9
    disk, bcast = res["disk"], res["bcast"]
    m1, mall, m2py = mem["memcpy_1thread_s"], mem["memcpy_all_threads_s"], mem["memcpy_2pythreads_s"]
    nthr = mem["default_threads"]

    def rate(sec: float) -> float:
        return gb / sec

    print(
        f"## Weight push: {gb:.3f} GB of bf16 ({n_tensors} tensors, 7B-class shapes), trainer process -> "
        "receiver process (copies into preallocated tensors)\n"
    )
    print(
        f"Median of {args.repeats} timed runs after 1 warm-up; GB = 1e9 bytes. Engine (headline row), disk and "
        "broadcast runs are interleaved; the other engine rows run afterwards; memcpy runs in the parent process "
        f"before the workers start. {os.cpu_count()} CPU cores, torch {torch.__version__} ({nthr} torch threads "
        "by default). 'threads' = torch threads in each of the 2 worker processes (sender, receiver)."
    )
    print(
        "memcpy 1 thread (one copy_ stream, torch.set_num_threads(1)) is the `memcpy_gbps` reference: the engine "
        "copies every byte twice (trainer tensor -> shm buffer in the sender, shm -> preallocated tensor in the "
        "receiver's `load`), in two processes that run in parallel, one core each, so one copy stream is what "
        f"the pipeline can reach at best. memcpy with {nthr} torch threads puts both cores on ONE copy: the engine "
        "cannot reach it (x memcpy all threads column, `ratio_vs_memcpy_all_threads`).\n"
    )
    print(
        "| method | bucket | buckets | threads | s per push | GB/s | × memcpy 1 thread | × memcpy all threads | "
        "× disk | bit-identical |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")

    def row(name, sec, bucket="–", nb="–", threads="–", ok=True):
        print(
            f"| {name} | {bucket} | {nb} | {threads} | {sec:.3f} | {rate(sec):.2f} | {m1 / sec:.2f} | "
            f"{mall / sec:.2f} | {disk['s'] / sec:.1f} | {_fmt_yes(ok)} |"
        )

    row("memcpy (copy_), one process", m1, threads=1, ok=mem["memcpy_identical"])
    row("memcpy (copy_), one process", mall, threads=nthr, ok=mem["memcpy_identical"])
    row(
        "memcpy, 2 Python threads × 1 torch thread (one copy_ per core)",
        m2py,
        threads="2×1",
        ok=mem["memcpy_identical"],
    )
    for k, r in enumerate(res["engine_cfgs"]):
        label = "**checkpoint engine** (shm, 1 sender → 1 receiver)" if k == 0 else "checkpoint engine"
        row(label, r["s"], f"{r['bucket_nbytes'] >> 20} MiB", int(r["n_buckets"]), r["threads"], r["identical"])
    row("safetensors save (trainer) + load (receiver), page cache warm", disk["s"], threads=nthr, ok=disk["identical"])
    if "disk_fsync" in res:
        row(
            "same, cold: fsync + evict from page cache before the load",
            res["disk_fsync"]["s"],
            threads=nthr,
            ok=res["disk_fsync"]["identical"],
        )
    row("torch.distributed.broadcast per tensor (gloo, 2 ranks)", bcast["s"], threads=nthr, ok=bcast["identical"])


def _print_stages(nbytes: int, args, mem: dict, res: dict, figures: dict) -> None:
    """Per-stage, per-tensor and summary lines."""
    gb = nbytes / 1e9
    eng, disk = res["engine"], res["disk"]

    def rate(sec: float) -> float:
        return gb / sec

    print(
        "\nEngine stages per row (medians): the receiver's time inside `load` (shm -> preallocated tensors), the "
        "sender's time blocked on acks; the rest of the receiver's time is waiting for buckets and reassembling "
        "tensors split across buckets (into a buffer reused across updates, then `load` copies it again).\n"
    )
    print("| bucket | threads | buckets | s per push | receiver in `load` (s) | sender waiting for acks (s) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in res["engine_cfgs"]:
        print(
            f"| {r['bucket_nbytes'] >> 20} MiB | {r['threads']} | {int(r['n_buckets'])} | {r['s']:.3f} | "
            f"{r['load_s']:.3f} | {r['ack_wait_s']:.3f} |"
        )
    if "small" in res:
        sm = res["small"]
        print(
            f"\nPer-tensor overhead: {sm['n_tensors']} bf16 [64, 64] tensors ({sm['nbytes'] / 1e6:.0f} MB), "
            f"median of {args.repeats}:\n"
        )
        print("| method | s per push | µs per tensor | bit-identical |\n| --- | --- | --- | --- |")
        for name, r in (
            (
                "checkpoint engine (256 MiB bucket, "
                f"{int(sm['engine']['n_buckets'])} bucket(s), {args.engine_threads} thread(s))",
                sm["engine"],
            ),
            ("torch.distributed.broadcast per tensor (gloo)", sm["bcast"]),
        ):
            print(f"| {name} | {r['s']:.3f} | {r['s'] / sm['n_tensors'] * 1e6:.1f} | {_fmt_yes(r['identical'])} |")
    print(
        f"\nEngine, headline row: receiver `load` (shm -> preallocated tensors) busy {eng['load_s']:.3f} s "
        f"({rate(eng['load_s']):.2f} GB/s); sender push() {eng['push_elapsed_s']:.3f} s, of which waiting for "
        f"acks {eng['ack_wait_s']:.3f} s (copying into shm ≈ {eng['push_elapsed_s'] - eng['ack_wait_s']:.3f} s, "
        f"{rate(eng['push_elapsed_s'] - eng['ack_wait_s']):.2f} GB/s). Disk: save {disk['save_s']:.3f} s "
        f"({rate(disk['save_s']):.2f} GB/s), load {disk['load_s']:.3f} s ({rate(disk['load_s']):.2f} GB/s); the "
        "file stays in the page cache (no fsync, nothing dropped), so the disk row is optimistic."
    )
    print(
        f"Goals: >= 0.8x memcpy (1 thread): {figures['ratio_vs_memcpy']:.2f}x; >= 10x disk: "
        f"{figures['speedup_vs_disk']:.1f}x. Against memcpy with all threads: "
        f"{figures['ratio_vs_memcpy_all_threads']:.2f}x.\n"
    )


def _report(nbytes: int, n_tensors: int, args, mem: dict, res: dict) -> dict:
    """Print the tables; return the JSON figures."""
    figures = _figures(nbytes, args, mem, res)
    _print_main_table(nbytes, n_tensors, args, mem, res)
    _print_stages(nbytes, args, mem, res, figures)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=2.0, help="bytes to push, in 1e9 (rounded up to whole tensors)")
    parser.add_argument("--bucket-mib", type=int, default=256, help="engine bucket of the headline figure")
    parser.add_argument(
        "--sweep-mib",
        type=str,
        default="64,128,512",
        help="more bucket sizes for the engine alone (comma list; empty: none)",
    )
    parser.add_argument(
        "--engine-threads",
        type=int,
        default=1,
        help="torch threads in each engine worker process (1: one core per pipeline stage)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--small-tensors", type=int, default=20000, help="per-tensor overhead run: this many 8 KiB tensors (0: skip)"
    )
    parser.add_argument(
        "--no-fsync-row", action="store_true", help="skip the cold-disk rows (save + fsync + evict + load)"
    )
    parser.add_argument("--quick", action="store_true", help="~0.3 GB, 2 repeats, sweep 64 MiB only, no cold-disk row")
    args = parser.parse_args()
    if args.quick:
        args.gb, args.repeats, args.sweep_mib, args.no_fsync_row = 0.3, 2, "64", True
        args.small_tensors = min(args.small_tensors, 2000)
    default_threads = torch.get_num_threads()
    head = args.bucket_mib << 20
    cfgs = [(head, args.engine_threads)]
    cfgs += [
        (int(x) << 20, args.engine_threads) for x in args.sweep_mib.split(",") if x.strip() and int(x) << 20 != head
    ]
    if args.engine_threads != default_threads:  # the same headline bucket at the default thread count
        cfgs.append((head, default_threads))

    shapes = model_shapes(int(args.gb * 1e9))
    nbytes = sum(2 * _numel(s) for _, s in shapes)
    mem = bench_memcpy(shapes, args.repeats)

    runs_dir = ROOT / "runs"
    runs_dir.mkdir(exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="weight_sync_", dir=runs_dir))  # real disk (runs/ is git-ignored)
    shm_prefix = f"wsbench{os.getpid()}"
    pair = None
    try:
        pair = _Pair(shapes, workdir)
        res = bench_pipelines(pair, workdir, cfgs, args.repeats, shm_prefix, default_threads, not args.no_fsync_row)
        pair.close()
        pair = None
        if args.small_tensors > 0:
            res["small"] = bench_small(
                workdir, args.small_tensors, args.repeats, shm_prefix, args.engine_threads, default_threads
            )
    finally:
        if pair is not None:
            pair.close()
        shutil.rmtree(workdir, ignore_errors=True)
        _sweep_shm(shm_prefix)
    figures = _report(nbytes, len(shapes), args, mem, res)
    print(json.dumps(figures))


def _sweep_shm(prefix: str) -> None:
    """Unlink shm segments of this run left by dead workers (only names carrying this run's prefix)."""
    try:
        from k2post_checkpoint_engine import sweep_stale_segments

        sweep_stale_segments(prefix)
    except Exception:
        pass
    left = [p for p in Path("/dev/shm").glob(prefix + "*")] if Path("/dev/shm").is_dir() else []
    if left:
        print(f"warning: shm segments left behind: {[p.name for p in left]}", file=sys.stderr)


if __name__ == "__main__":
    main()
