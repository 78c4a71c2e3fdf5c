"""Run outputs written while training: metrics.jsonl rows and the progress display (rank 0 only).

metrics.jsonl has one JSON object per line: a row per optimizer step (`step`, `epoch`, `loss`,
`lr`, `tokens`, `label_tokens`, `tokens_total`, `step_time_s`, `tokens_per_s`, `perf/tokens_per_s`, `perf/mfu`,
`qk_clip/*`),
with `eval_loss` / `eval_tokens` added on steps where the held-out loss was measured; step 0
is the eval before training. On resume, rows after the checkpoint's step are dropped first,
so the file always reads as one run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def _clean(value: Any) -> Any:
    """JSON-safe value: non-finite floats become None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsLog:
    """Appends rows to metrics.jsonl (a no-op on ranks other than 0)."""

    def __init__(self, path: Path, enabled: bool = True) -> None:
        self.path, self.enabled = path, enabled

    def append(self, row: dict[str, Any]) -> None:
        """Write one row and flush it."""
        if self.enabled:
            with self.path.open("a") as handle:
                handle.write(json.dumps({k: _clean(v) for k, v in row.items()}) + "\n")

    def truncate_after(self, step: int) -> None:
        """Drop rows of steps after `step` (what a resumed run will redo)."""
        if not self.enabled or not self.path.is_file():
            return
        keep = [
            line for line in self.path.read_text().splitlines() if _step_of(line) is not None and _step_of(line) <= step
        ]
        self.path.write_text("".join(line + "\n" for line in keep))


def _step_of(line: str) -> int | None:
    """The step of a metrics line; None for a blank line or one torn by a crash mid-write."""
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All rows of a metrics.jsonl file."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def rate_text(value: float) -> str:
    """A rate for a progress line: 950, 1.2k, 3.4M."""
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.1f}{suffix}"
    return f"{value:.0f}"


def perf_text(row: dict[str, Any], key: str = "perf/tokens_per_s") -> str:
    """`1.2k tok/s MFU 3.1%` of a metrics row (what it has of the two)."""
    parts = [f"{rate_text(row[key])} tok/s"] if row.get(key) is not None else []
    if row.get("perf/mfu") is not None:
        percent = 100 * row["perf/mfu"]
        parts.append(f"MFU {percent:.2g}%" if percent < 1 else f"MFU {percent:.1f}%")
    return " ".join(parts)


class ProgressDisplay:
    """A rich progress bar on a terminal, plus a plain line every `log_every` steps (always)."""

    def __init__(self, total: int, start: int, log_every: int, bar: bool, enabled: bool = True) -> None:
        self.console = Console()
        self.log_every, self.enabled = log_every, enabled
        self.progress: Progress | None = None
        if enabled and bar and self.console.is_terminal:
            self.progress = Progress(
                TextColumn("sft"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=self.console,
            )
            self.task = self.progress.add_task("sft", total=total, completed=start, info="")
            self.progress.start()

    def print(self, text: str) -> None:
        """A line above the bar (rank 0 only)."""
        if self.enabled:
            self.console.print(text, highlight=False)

    def update(self, row: dict[str, Any], total: int) -> None:
        """Advance to `row['step']`; print a line every log_every steps and on eval steps."""
        if not self.enabled:
            return
        info = f"loss {row['loss']:.4f} lr {row['lr']:.2e}"
        if row.get("eval_loss") is not None:
            info += f" eval {row['eval_loss']:.4f}"
        if self.progress is not None:
            self.progress.update(self.task, completed=row["step"], info=info)
        if row["step"] % self.log_every == 0 or row["step"] == total or "eval_loss" in row:
            self.print(f"step {row['step']}/{total} {info} ({perf_text(row)})")

    def close(self) -> None:
        """Stop the live bar."""
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
