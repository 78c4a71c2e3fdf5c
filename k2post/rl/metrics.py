"""RL run outputs: metrics.jsonl rows, TensorBoard events and PNG plots.

    log = RunLog(run_dir)                  # metrics.jsonl + tb/ (TensorBoard)
    log.append({"iteration": 3, "reward/mean": 0.4, ...})
    write_plots(run_dir / "metrics.jsonl", run_dir / "plots")

Plots (one PNG each): reward, held-out accuracy per environment, response length and truncation
rate, max attention logit, weight-sync time, time per phase; with the critic in the mix, its
agreement with the verifier (critic_calibration: held-out and on-policy) and how it judges
(unparseable, tie, position-A and order-disagreement rates); diagnostics.png, why RL is flat:
fraction of groups with nonzero advantage, reward std per group, policy entropy, |log pi - log pi_old|,
grad norm and Muon update RMS (a panel per metric logged); throughput.png: train and rollout tokens/s, MFU.

`perf/*` (per iteration): `perf/train_tokens_per_s`, the tokens of a step's sequences (all ranks) over rank 0's
`time/trainer_step_s`; `perf/mfu`, those tokens' training FLOPs (k2post/train/mfu.py: 3 x forward, attention at
each sequence's causal length, the LM head only at the positions whose logits the trainer computes) over the
peak FLOP/s x trainer ranks — both the mean over the iteration's steps;
`perf/rollout_tokens_per_s`, model-written tokens of the episodes that finished this iteration over
`time/rollout_s` (with partial rollout an episode's earlier iterations' tokens count when it finishes).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from k2post.train.metrics import MetricsLog

PLOTS = {
    "reward": ("reward/mean", "reward/shaped_mean"),
    "heldout_accuracy": ("accuracy",),
    "max_logit": ("max_logit",),
    "weight_sync": ("time/push_s",),
    "phase_times": ("time/",),
    "critic_agreement": ("critic_calibration/accuracy", "reward/critic_calibration"),
    "critic_judging": (
        "critic/unparseable_rate",
        "critic/tie_rate",
        "critic/position_a_rate",
        "critic/order_disagreement_rate",
    ),
}

# multi-panel figures: name -> (panel title, key prefixes) per panel (scales differ, so one axis each)
PANELS: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "length_truncation": (
        ("response length (model tokens, mean)", ("rollout/response_tokens_mean",)),
        ("truncation rate (budget control)", ("rollout/truncation_rate",)),
    ),
    "agentic": (  # multi-turn tool environments (rl.diagnostics.agentic_metrics), one line per env
        ("success rate", ("/success_rate",)),
        ("well-formed tool-call rate", ("/well_formed_call_rate",)),
        ("assistant turns per episode", ("/turns_mean",)),
        ("tool errors per episode", ("/tool_errors_mean",)),
    ),
    "diagnostics": (  # why is RL flat? (docs/RL.md, "Diagnostics")
        ("groups with nonzero advantage (fraction)", ("rollout/groups_nonzero_adv_frac",)),
        ("reward std per group", ("rollout/reward_std_",)),
        ("policy entropy (nats/token)", ("train/entropy",)),
        ("|log pi - log pi_old| per sequence", ("train/logratio_abs_",)),
        ("grad norm (L2, before the step)", ("train/grad_norm",)),
        ("Muon update RMS", ("train/muon_update_rms",)),
    ),
    "throughput": (
        ("tokens/s", ("perf/train_tokens_per_s", "perf/rollout_tokens_per_s")),
        ("MFU (train step)", ("perf/mfu",)),
    ),
}


@dataclass(frozen=True)
class PerfModel:
    """What `perf/mfu` needs: the trained model's config, forward matmul FLOPs per token (all, and the LM head's
    share), one rank's peak."""

    config: Any
    matrix_flops: int
    head_flops: int
    peak_flops: float
    peak_source: str


def perf_model(model_dir: str, dtype: str, device: str) -> PerfModel:
    """The `PerfModel` of the HF model in `model_dir` (built on the meta device) on a trainer `device`."""
    from k2post.models.stats import load_config, matrix_flops_per_token, meta_model
    from k2post.train.mfu import head_flops_per_token, peak_flops

    config = load_config(model_dir)
    peak, source = peak_flops(device, dtype)
    model = meta_model(config)
    return PerfModel(config, matrix_flops_per_token(model), head_flops_per_token(model), peak, source)


def train_perf(
    perf: PerfModel | None, rows: list[tuple[int, int]], seconds: float | None, world_size: int
) -> dict[str, float]:
    """`perf/train_tokens_per_s` and (with a `perf` model) `perf/mfu` of one optimizer step over sequences of
    (tokens, LM-head positions: `k2post.train.mfu.head_positions`) taking `seconds`; {} without a step time."""
    from k2post.train.mfu import mfu, step_train_flops

    tokens = sum(n for n, _ in rows)
    if not seconds or not tokens:
        return {}
    out = {"perf/train_tokens_per_s": tokens / seconds}
    if perf is not None:
        flops = step_train_flops(perf.config, perf.matrix_flops, perf.head_flops, rows)
        out["perf/mfu"] = mfu(tokens / seconds, flops / tokens, perf.peak_flops * world_size)
    return out


def rollout_perf(episodes: list[Any], seconds: float) -> dict[str, float]:
    """`perf/rollout_tokens_per_s`: model-written tokens of the finished `episodes` over the rollout `seconds`."""
    tokens = sum(int(getattr(episode, "generated_tokens", 0)) for episode in episodes)
    return {"perf/rollout_tokens_per_s": tokens / seconds} if seconds > 0 else {}


def ledger_digest(keys: Iterable[str]) -> str:
    """A short fingerprint of a multiset of ids (order-free; a lost or repeated id changes it): what the
    `ledger/*` columns record of the prompts drawn, episodes finished, groups trained and groups paused, so that
    a resumed run can be compared with an uninterrupted one iteration by iteration."""
    import xxhash

    return xxhash.xxh3_64_hexdigest("\n".join(sorted(keys)).encode("utf-8"))


class RunLog:
    """metrics.jsonl (keyed by `iteration`) plus TensorBoard scalars."""

    def __init__(self, run_dir: Path, tensorboard: bool = True) -> None:
        self.jsonl = MetricsLog(run_dir / "metrics.jsonl")
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(run_dir / "tb"))

    def append(self, row: dict[str, Any]) -> None:
        self.jsonl.append(row)
        if self.writer is not None:
            for key, value in row.items():
                if isinstance(value, (int, float)) and key != "iteration" and math.isfinite(float(value)):
                    self.writer.add_scalar(key, float(value), int(row["iteration"]))
            self.writer.flush()

    def truncate_after(self, iteration: int) -> None:
        """Drop rows after `iteration` and any torn line (a resumed run rewrites them)."""
        path = self.jsonl.path
        if path.is_file():
            keep = [json.dumps(r) for r in read_metrics(path) if int(r["iteration"]) <= iteration]
            path.write_text("".join(line + "\n" for line in keep))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of metrics.jsonl; a line torn by a crash mid-write is skipped."""
    rows = []
    for line in Path(path).read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and "iteration" in row:
            rows.append(row)
    return rows


def _series(rows: list[dict[str, Any]], prefixes: tuple[str, ...]) -> dict[str, tuple[list[int], list[float]]]:
    out: dict[str, tuple[list[int], list[float]]] = {}
    for row in rows:
        for key, value in row.items():
            if isinstance(value, (int, float)) and any(key.startswith(p) or key.endswith(p) for p in prefixes):
                xs, ys = out.setdefault(key, ([], []))
                xs.append(int(row["iteration"]))
                ys.append(float(value))
    return out


def _draw(plt: Any, title: str, panels: list[tuple[str, dict[str, tuple[list[int], list[float]]]]], path: Path) -> Path:
    """One figure: a grid of panels (two columns from three panels on), each series a line over iterations."""
    cols = 1 if len(panels) < 3 else 2
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.5 * rows), squeeze=False)
    for ax, (panel_title, series) in zip(axes.flat, panels):
        for key, (xs, ys) in sorted(series.items()):
            ax.plot(xs, ys, marker=".", label=key)
        ax.set_xlabel("iteration")
        ax.set_title(panel_title)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    if len(panels) > 1:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def write_plots(metrics_path: Path, out_dir: Path) -> list[Path]:
    """One PNG per entry of PLOTS and of PANELS (panels without data left out, a figure with none skipped);
    returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in read_metrics(metrics_path) if "iteration" in r]
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = {name: ((name.replace("_", " "), prefixes),) for name, prefixes in PLOTS.items()} | PANELS
    written = []
    for name, panels in figures.items():
        with_data = [(title, series) for title, prefixes in panels if (series := _series(rows, prefixes))]
        if with_data:
            written.append(_draw(plt, name.replace("_", " "), with_data, out_dir / f"{name}.png"))
    return written


def summary_of(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """First and last held-out accuracy per environment, and the reward trend."""
    evals = [r for r in rows if any(k.startswith("eval/") for k in r)]
    rewards = [r["reward/mean"] for r in rows if "reward/mean" in r]
    first, last = (evals[0], evals[-1]) if evals else ({}, {})
    return {
        "eval_first": {k: v for k, v in first.items() if k.startswith("eval/")},
        "eval_last": {k: v for k, v in last.items() if k.startswith("eval/")},
        "reward_first": rewards[0] if rewards else None,
        "reward_last": rewards[-1] if rewards else None,
        "iterations": max((int(r["iteration"]) for r in rows), default=0),
    }


def dump_json(path: Path, data: dict[str, Any]) -> None:
    """Write JSON atomically (tmp + rename)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    tmp.replace(path)
