"""Model FLOPs utilization (MFU) of a training step: useful model FLOPs per second over the device's peak.

    peak, source = peak_flops(torch.device("cuda"))         # 989e12, "table: NVIDIA H100 80GB HBM3"
    per_token = train_flops_per_token(model, causal_context(lengths))
    row["perf/mfu"] = mfu(tokens / seconds, per_token, peak * world_size)

Peak FLOP/s per device: on a GPU, the dense (no sparsity) bf16 tensor-core figure of its datasheet, looked up
by `torch.cuda.get_device_name()` in `PEAK_BF16_FLOPS`; on the CPU, or a GPU not in the table, a measured
peak: the best of a few square matmuls (up to `MEASURE_SIZE`^2, smaller where one would take over 0.2 s) in the
training dtype with this process's torch threads, measured once per process (`functools.cache`). A measured
peak is what the matmul kernels reach here, so a CPU MFU reads against that, not a datasheet (1024^2 fp32
matmuls on 2 AVX2 cores: 30-65 GFLOP/s, noisy when other processes share the cores).

Training FLOPs per token = 3 x the forward FLOPs of `k2post.models.stats` (backward = 2 x forward): 2 x the
active matmul weights (MoE: routed experts x k / E) plus the attention scores at `context` keys per token.
Recomputation (activation checkpointing) and padding are not counted: MFU counts useful work only.
"""

from __future__ import annotations

import functools
import re
import time
from typing import Any

from k2post.models.stats import attention_flops_per_token, causal_context, matrix_flops_per_token

__all__ = [
    "PEAK_BF16_FLOPS",
    "causal_context",
    "mfu",
    "peak_flops",
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


def table_peak(device_name: str) -> float | None:
    """The datasheet dense bf16 FLOP/s of a device called `device_name`, None when it is not in the table."""
    for pattern, flops in PEAK_BF16_FLOPS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return flops
    return None


@functools.cache
def measured_peak(device: str = "cpu", dtype_name: str = "float32", max_size: int = MEASURE_SIZE) -> float:
    """Best FLOP/s of square matmuls in `dtype_name` on `device` (this process's threads; once per process).

    The size doubles from 128 while the next size's matmul (8x the work) would take under MEASURE_STEP_S, up
    to `max_size`, so a slow dtype (bf16 on a CPU without bf16 units: ~1 GFLOP/s) costs well under a second too."""
    import torch

    dtype, size = getattr(torch, dtype_name), 128
    while size < max_size and 8 * min(_time_mm(size, device, dtype) for _ in range(2)) < MEASURE_STEP_S:
        size *= 2
    best = min(_time_mm(size, device, dtype) for _ in range(MEASURE_REPEATS))
    return 2.0 * size**3 / max(best, 1e-9)


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
    return measured_peak("cpu", dtype_name), f"measured: CPU, {dtype_name} matmul, {torch.get_num_threads()} threads"


def train_flops_per_token(model: Any, context: float, matrix_flops: int | None = None) -> float:
    """Training FLOPs per token (3 x forward) of `model` at `context` keys per token; `matrix_flops`: the
    model's `matrix_flops_per_token` when the caller already has it (it walks every parameter)."""
    matrix = matrix_flops_per_token(model) if matrix_flops is None else matrix_flops
    return train_flops(model.config, matrix, context)


def train_flops(config: Any, matrix_flops: float, context: float) -> float:
    """3 x (forward matmul FLOPs per token + attention FLOPs at `context` keys) of a model with HF `config`."""
    return 3.0 * (matrix_flops + attention_flops_per_token(config, context))


def mfu(tokens_per_s: float, flops_per_token: float, peak_flops: float) -> float:
    """Model FLOPs utilization: achieved FLOP/s (tokens/s x FLOPs per token) over the peak FLOP/s."""
    if peak_flops <= 0:
        raise ValueError(f"peak FLOP/s must be positive, got {peak_flops}")
    return tokens_per_s * flops_per_token / peak_flops
