"""Model FLOPs utilization (MFU) of a training step: useful model FLOPs per second over the device's peak.

    peak, source = peak_flops(torch.device("cuda"))         # 989e12, "table: NVIDIA H100 80GB HBM3"
    per_token = train_flops_per_token(model, causal_context(lengths))
    row["perf/mfu"] = mfu(tokens / seconds, per_token, peak * world_size)

Peak FLOP/s per device: on a GPU, the dense (no sparsity) bf16 tensor-core figure of its datasheet, looked up
by `torch.cuda.get_device_name()` in `PEAK_BF16_FLOPS`; on the CPU, or a GPU not in the table, a measured
peak: the best of a few square matmuls (up to `MEASURE_SIZE`^2, smaller where one would take over 0.2 s) in the
training dtype with this process's torch threads, in 3 rounds spread over time, and never below the best measured
before on this machine with those threads (kept in `peak_cache_path()`, ~/.cache/k2post/peak_flops.json), once
per process (`functools.cache`). A measured peak is what the matmul kernels reach here, so a CPU MFU reads
against that, not a datasheet (1024^2 fp32 matmuls on 2 AVX2 cores: 30-65 GFLOP/s; the low end when other
processes share the cores, which is why one measurement alone is not trusted: it read MFU 1.25 beside a
concurrent pytest).

Training FLOPs per token = 3 x the forward FLOPs of `k2post.models.stats` (backward = 2 x forward): 2 x the
active matmul weights (MoE: routed experts x k / E) plus the attention scores at `context` keys per token.
Recomputation (activation checkpointing) and padding are not counted: MFU counts useful work only.

The LM head runs only where logits are computed. SFT computes them at every token (`train_flops_per_token`); the
RL trainer only from the position that predicts a row's first trained token to its end (`logits_window`), so an
RL step counts the head on each row's `head_positions` and the rest of the model on all its tokens
(`step_train_flops`; counting the head on prompt tokens too overstated RL matrix FLOPs by 19-31 %, issue 42).
"""

from __future__ import annotations

import functools
import json
import os
import platform
import re
import time
from pathlib import Path
from collections.abc import Sequence
from typing import Any

from k2post.models.stats import attention_flops_per_token, causal_context, matrix_flops_per_token

__all__ = [
    "PEAK_BF16_FLOPS",
    "causal_context",
    "head_flops_per_token",
    "head_positions",
    "mfu",
    "peak_flops",
    "step_train_flops",
    "train_flops",
    "train_flops_per_token",
    "table_peak",
]

# dense bf16 tensor-core FLOP/s by device name (datasheets, no sparsity); the first pattern that matches wins
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    (r"\bH100\b.*\bPCIe\b", 756e12),
    (r"\bH100\b.*\bNVL\b", 835e12),
    (r"\bH100\b", 989e12),  # SXM ("NVIDIA H100 80GB HBM3")
    (r"\bH200\b", 989e12),
    (r"\bH800\b", 989e12),
    (r"\bH20\b", 148e12),
    (r"\bB200\b", 2250e12),
    (r"\bA100\b", 312e12),
    (r"\bA800\b", 312e12),
    (r"\bL40S\b", 362e12),
    (r"\bL4\b", 121e12),
    (r"\bMI300X\b", 1307e12),
)
MEASURE_SIZE = 1024
MEASURE_REPEATS = 5
MEASURE_STEP_S = 0.2
MEASURE_ROUNDS = 3
MEASURE_PAUSE_S = 0.05


def table_peak(device_name: str) -> float | None:
    """The datasheet dense bf16 FLOP/s of a device called `device_name`, None when it is not in the table."""
    for pattern, flops in PEAK_BF16_FLOPS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return flops
    return None


@functools.cache
def measured_peak(device: str = "cpu", dtype_name: str = "float32", max_size: int = MEASURE_SIZE) -> float:
    """Best FLOP/s of square matmuls in `dtype_name` on `device` with this process's threads: the best of
    `MEASURE_ROUNDS` rounds now and of every earlier measurement on this machine (`peak_cache_path()`), so other
    processes busy on the cores while one run measures cannot lower it (an MFU over 1 was that). Once per process.

    The size doubles from 128 while the next size's matmul (8x the work) would take under MEASURE_STEP_S, up
    to `max_size`, so a slow dtype (bf16 on a CPU without bf16 units: ~1 GFLOP/s) costs well under a second too."""
    import torch

    best = max(_measure_round(device, getattr(torch, dtype_name), max_size) for _ in range(MEASURE_ROUNDS))
    return remember_peak(_peak_key(device, dtype_name), best)


def _measure_round(device: str, dtype: Any, max_size: int) -> float:
    """FLOP/s of the fastest of MEASURE_REPEATS matmuls at the size the time budget allows, after a short pause
    (rounds spread over time see past a burst of other work on the cores)."""
    time.sleep(MEASURE_PAUSE_S)
    size = 128
    while size < max_size and 8 * min(_time_mm(size, device, dtype) for _ in range(2)) < MEASURE_STEP_S:
        size *= 2
    best = min(_time_mm(size, device, dtype) for _ in range(MEASURE_REPEATS))
    return 2.0 * size**3 / max(best, 1e-9)


def peak_cache_path() -> Path:
    """Where the best measured peaks are kept: $K2POST_CACHE_DIR, else $XDG_CACHE_HOME/k2post, else ~/.cache/k2post."""
    root = (
        os.environ.get("K2POST_CACHE_DIR")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "k2post"
    )
    return Path(root) / "peak_flops.json"


def remember_peak(key: str, measured: float) -> float:
    """max(`measured`, the best kept for `key`), kept for the next run (a cache that cannot be read or written
    is skipped: the peak of this run is still measured)."""
    path = peak_cache_path()
    try:
        kept = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        kept = {}
    best = max(measured, float(kept.get(key, 0.0)))
    if best > float(kept.get(key, 0.0)):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({**kept, key: best}, indent=1, sort_keys=True))
            tmp.replace(path)
        except OSError:
            pass
    return best


def _peak_key(device: str, dtype_name: str) -> str:
    """The machine, device, thread count, dtype and torch version a measured peak belongs to."""
    import torch

    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(torch.device(device))
    else:
        name = _cpu_name()
    threads = f"{torch.get_num_threads()} threads"
    return f"{platform.node()} | {device.split(':')[0]} | {name} | {threads} | {dtype_name} | torch {torch.__version__}"


def _cpu_name() -> str:
    """The CPU model (/proc/cpuinfo on Linux), else what `platform` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _time_mm(size: int, device: str, dtype: Any) -> float:
    """Seconds of one `size` x `size` matmul (operands made and synchronized before the clock starts)."""
    import torch

    a, b = (torch.randn(size, size, device=device).to(dtype) for _ in range(2))
    if device != "cpu":
        torch.cuda.synchronize()
    started = time.perf_counter()
    torch.mm(a, b)
    if device != "cpu":
        torch.cuda.synchronize()
    return time.perf_counter() - started


def peak_flops(device: Any = "cpu", dtype: Any = "float32") -> tuple[float, str]:
    """(peak FLOP/s of one `device`, where the figure comes from): the table on a known GPU, else measured."""
    import torch

    device = torch.device(device)
    dtype_name = str(dtype).removeprefix("torch.")
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = table_peak(name)
        if peak is not None:
            return peak, f"table: {name}"
        return measured_peak(str(device), "bfloat16"), f"measured: {name}, bfloat16 matmul"
    threads = torch.get_num_threads()
    return measured_peak("cpu", dtype_name), f"measured: CPU, {dtype_name} matmul, {threads} threads (best seen here)"


def train_flops_per_token(model: Any, context: float, matrix_flops: int | None = None) -> float:
    """Training FLOPs per token (3 x forward) of `model` at `context` keys per token; `matrix_flops`: the
    model's `matrix_flops_per_token` when the caller already has it (it walks every parameter)."""
    matrix = matrix_flops_per_token(model) if matrix_flops is None else matrix_flops
    return train_flops(model.config, matrix, context)


def train_flops(config: Any, matrix_flops: float, context: float) -> float:
    """3 x (forward matmul FLOPs per token + attention FLOPs at `context` keys) of a model with HF `config`."""
    return 3.0 * (matrix_flops + attention_flops_per_token(config, context))


def head_flops_per_token(model: Any) -> int:
    """Forward FLOPs of the LM head for one position: 2 x its weights (0 for a model without one)."""
    from k2post.models.stats import numel

    head = model.get_output_embeddings()
    return 2 * numel(head.weight) if head is not None else 0


def head_positions(loss_mask: Sequence[int]) -> int:
    """Positions whose logits the RL trainer computes for a row: from the one predicting its first trained token
    to its end (`k2post.rl.losses.logits_window` of the row alone; 1 when nothing is trained, as there)."""
    first = next((i for i, trained in enumerate(loss_mask) if trained), None)
    return 1 if first is None else len(loss_mask) - max(first - 1, 0)


def step_train_flops(config: Any, matrix_flops: float, head_flops: float, rows: Sequence[tuple[int, int]]) -> float:
    """Training FLOPs (3 x forward) of a step over `rows` of (tokens, head positions): the model but its head at
    every token, the head at the head positions, attention causal within each row."""
    body = sum(n * (matrix_flops - head_flops) for n, _ in rows)
    head = sum(h * head_flops for _, h in rows)
    attention = sum(n * attention_flops_per_token(config, (n + 1) / 2) for n, _ in rows)
    return 3.0 * (body + head + attention)


def mfu(tokens_per_s: float, flops_per_token: float, peak_flops: float) -> float:
    """Model FLOPs utilization: achieved FLOP/s (tokens/s x FLOPs per token) over the peak FLOP/s."""
    if peak_flops <= 0:
        raise ValueError(f"peak FLOP/s must be positive, got {peak_flops}")
    return tokens_per_s * flops_per_token / peak_flops
