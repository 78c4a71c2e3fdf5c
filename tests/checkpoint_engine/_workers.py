"""Subprocess entry points for the multi-process checkpoint-engine tests (not collected by pytest).

    python tests/checkpoint_engine/_workers.py sender   '<json args>'
    python tests/checkpoint_engine/_workers.py receiver '<json args>'
    python tests/checkpoint_engine/_workers.py shm_holder '<json args>'

Senders form a gloo group (127.0.0.1), register a mixed model (replicated, rank-exclusive,
ZeRO-style shards, a collective gather materializer) and push `n_updates` updates whose values
depend on the update index. Receivers rebuild the expected tensors themselves and compare them
bitwise. Each process writes a JSON result to `result`; failures are reported there, not raised.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from k2post_checkpoint_engine import CheckpointEngineConfig, Shard, WeightReceiver, WeightSender  # noqa: E402
from k2post_checkpoint_engine.shm import ShmSegment, list_segments  # noqa: E402

# name, shape, dtype, kind: "replicated" | "rank:<i>" (i = index into ranks, modulo ws) | "shard" | "zero3"
MODEL: list[tuple[str, tuple[int, ...], torch.dtype, str]] = [
    ("embed", (37, 29), torch.float32, "replicated"),
    ("norm", (29,), torch.bfloat16, "replicated"),
    ("scalar", (), torch.float32, "replicated"),
    ("huge", (3001,), torch.float32, "replicated"),
    ("ids", (5, 3), torch.int64, "rank:-1"),
    ("mask", (11,), torch.bool, "rank:0"),
    ("empty", (0, 4), torch.float32, "rank:0"),
    ("half", (3, 5, 2), torch.float16, "rank:1"),
    ("bigshard", (50, 31), torch.float32, "shard"),
    ("odd_shard", (7,), torch.int64, "shard"),
    ("zero3", (17, 9), torch.bfloat16, "zero3"),
    ("zero3_big", (1201,), torch.float32, "zero3"),
]


def model_specs(bulk_numel: int = 0) -> list[tuple[str, tuple[int, ...], torch.dtype, str]]:
    """MODEL plus, optionally, a replicated fp32 "bulk" tensor (to make leaks visible in RSS)."""
    return MODEL + ([("bulk", (bulk_numel,), torch.float32, "replicated")] if bulk_numel else [])


def make_model(update: int, bulk_numel: int = 0) -> dict[str, torch.Tensor]:
    """Deterministic full tensors for update `update` (same on every process)."""
    g = torch.Generator().manual_seed(1000 + update)
    out = {}
    for name, shape, dtype, _ in model_specs(bulk_numel):
        if dtype == torch.int64:
            out[name] = torch.randint(-(2**40), 2**40, shape, generator=g)
        elif dtype == torch.bool:
            out[name] = torch.rand(shape, generator=g) > 0.5
        else:
            out[name] = torch.randn(shape, generator=g).to(dtype)
    return out


def expected_model(update: int, cast: str | None, bulk_numel: int = 0) -> dict[str, torch.Tensor]:
    model = make_model(update, bulk_numel)
    if cast is None:
        return model
    dtype = getattr(torch, cast)
    return {n: t.to(dtype) if t.is_floating_point() else t for n, t in model.items()}


def shard_bounds(numel: int, ws: int) -> list[int]:
    """Uneven flat partition boundaries (rank 0 may get an empty shard)."""
    return [numel * r * r // (ws * ws) for r in range(ws + 1)]


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.cpu().reshape(-1).view(torch.uint8), b.cpu().reshape(-1).view(torch.uint8))


def rss_nbytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Zero3Param:
    """A ZeRO-3-like parameter: each rank holds an equal, padded flat partition."""

    def __init__(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, rank: int, ws: int, device: str) -> None:
        self.name, self.shape, self.dtype, self.rank, self.ws = name, shape, dtype, rank, ws
        self.part_numel = -(-math.prod(shape) // ws)
        self.partition = torch.zeros(self.part_numel, dtype=dtype, device=device)
        self.enters = self.exits = 0

    def set_full(self, full: torch.Tensor) -> None:
        flat = torch.zeros(self.part_numel * self.ws, dtype=self.dtype, device=self.partition.device)
        flat[: full.numel()] = full.reshape(-1)
        self.partition.copy_(flat[self.rank * self.part_numel : (self.rank + 1) * self.part_numel])

    @contextlib.contextmanager
    def gathered(self):  # the "gather context" (like deepspeed.zero.GatheredParameters)
        self.enters += 1
        parts = [torch.empty_like(self.partition) for _ in range(self.ws)]
        if self.ws > 1:
            torch.distributed.all_gather(parts, self.partition)
        else:
            parts = [self.partition]
        yield torch.cat(parts)[: math.prod(self.shape)].view(self.shape)
        self.exits += 1


def build_sources(
    sender: WeightSender, rank: int, ws: int, bulk_numel: int = 0, device: str = "cpu"
) -> tuple[dict, dict]:
    """Register every model tensor the way this rank holds it; returns the live sources to refresh."""
    full, shards, zero3 = {}, {}, {}
    for name, shape, dtype, kind in model_specs(bulk_numel):
        if kind == "replicated" or (kind.startswith("rank:") and int(kind[5:]) % ws == rank):
            full[name] = torch.zeros(shape, dtype=dtype, device=device)
            sender.register(name, full[name])
        elif kind == "shard":
            b = shard_bounds(math.prod(shape), ws)
            shards[name] = (b[rank], torch.zeros(b[rank + 1] - b[rank], dtype=dtype, device=device))
            sender.register(name, Shard(shards[name][1], shape, b[rank]))
        elif kind == "zero3":
            zero3[name] = Zero3Param(name, shape, dtype, rank, ws, device)
            sender.register(name, zero3[name].gathered, shape=shape, dtype=dtype, collective=True)
    return {"full": full, "shards": shards}, zero3


def refresh(sources: dict, zero3: dict, update: int, bulk_numel: int = 0) -> None:
    """Write update `update`'s values into the live sources, in place."""
    model = make_model(update, bulk_numel)
    for name, t in sources["full"].items():
        t.copy_(model[name])
    for name, (start, local) in sources["shards"].items():
        local.copy_(model[name].reshape(-1)[start : start + local.numel()])
    for name, p in zero3.items():
        p.set_full(model[name])


def run_sender(a: dict[str, Any]) -> dict[str, Any]:
    rank, ws = a["rank"], a["world_size"]
    cuda = a["config"].get("device") == "cuda"
    if cuda:
        torch.cuda.set_device(rank % torch.cuda.device_count())
    if ws > 1:
        torch.distributed.init_process_group(
            "nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{a['master_port']}", rank=rank, world_size=ws,
            timeout=timedelta(seconds=a["timeout_s"] * 2),
        )  # fmt: skip
    cfg = CheckpointEngineConfig(**a["config"])
    serve = rank in a["serve_ranks"]
    out: dict[str, Any] = {"rank": rank, "stats": [], "rss": [], "shm": []}
    with WeightSender(cfg, rank, ws, serve=serve) as sender:
        if serve:
            Path(a["addr_dir"], f"addr{rank}.tmp").write_text(sender.address)
            os.replace(Path(a["addr_dir"], f"addr{rank}.tmp"), Path(a["addr_dir"], f"addr{rank}"))
        bulk = a.get("bulk_numel", 0)
        sources, zero3 = build_sources(sender, rank, ws, bulk, a.get("source_device", "cpu"))
        for u in range(a["n_updates"]):
            refresh(sources, zero3, u, bulk)
            st = sender.push()
            out["stats"].append([st.nbytes, st.n_buckets, st.n_tensors])
            if u in a.get("probe_updates", []):
                out["rss"].append(rss_nbytes())
                out["shm"].append(list_segments(cfg.shm_prefix))
        out["zero3_balanced"] = all(p.enters == p.exits == a["n_updates"] for p in zero3.values())
        out["plan_json"] = json.dumps([b.to_dict() for b in sender._plan or []], sort_keys=True)
    if ws > 1:
        torch.distributed.destroy_process_group()
    return out


def wait_for_file(path: Path, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s} s")
        time.sleep(0.02)
    return path.read_text()


def make_load(a: dict[str, Any], got: dict[str, torch.Tensor], marker: Path | None):
    def load(batch: list[tuple[str, torch.Tensor]]) -> None:
        for name, t in batch:
            if name in got:
                raise AssertionError(f"tensor {name!r} delivered twice in one update")
            got[name] = t.clone()
            if t.is_cuda != bool(a.get("cuda")):
                raise AssertionError(f"tensor {name!r} delivered on {t.device}")
        if marker is not None:  # kill test: announce we are inside load, then hang
            marker.write_text("in load")
            time.sleep(a["hang_s"])

    return load


def run_receiver(a: dict[str, Any]) -> dict[str, Any]:
    address = wait_for_file(Path(a["addr_dir"], f"addr{a['rank']}"), a["timeout_s"])
    if a.get("cuda"):
        torch.cuda.set_device(a["rank"] % torch.cuda.device_count())
    cast = a.get("cast")
    bulk = a.get("bulk_numel", 0)
    exp0 = expected_model(0, cast, bulk)
    expected = {n: (tuple(t.shape), t.dtype) for n, t in exp0.items()}
    got: dict[str, torch.Tensor] = {}
    marker = Path(a["marker"]) if a.get("marker") else None
    out: dict[str, Any] = {"mismatches": [], "rss": [], "updates": 0}
    rx = WeightReceiver(address, make_load(a, got, marker), timeout_s=a["timeout_s"], expected=expected)
    with rx:
        for u in range(a["n_updates"]):
            got.clear()
            rx.run_update()
            exp = expected_model(u, cast, bulk)
            out["mismatches"] += [f"u{u}:{n}" for n in exp if n not in got or not bitwise_equal(got[n], exp[n])]
            out["updates"] += 1
            if u in a.get("probe_updates", []):
                out["rss"].append(rss_nbytes())
        rx.serve(None)  # returns when the sender closes cleanly
    return out


def run_shm_holder(a: dict[str, Any]) -> dict[str, Any]:
    """Create a segment, announce its name, then sleep until killed (stale-sweep / signal tests)."""
    seg = ShmSegment.create(a["prefix"], 4096)
    Path(a["name_file"]).write_text(seg.name)
    time.sleep(a["sleep_s"])
    return {"name": seg.name}


def main() -> None:
    role, args = sys.argv[1], json.loads(sys.argv[2])
    fn = {"sender": run_sender, "receiver": run_receiver, "shm_holder": run_shm_holder}[role]
    try:
        result = {"ok": True, **fn(args)}
    except BaseException as e:  # report everything to the test
        result = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    Path(args["result"]).write_text(json.dumps(result))
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
