"""The SFT training loop: MuonClip (ZeroMuonClip) on the DeepSpeed engine, packed chat rows.

    summary = run_sft(load_run_config("configs/sft_tool_use.yaml", expected_kind="sft"))

One process by default (CPU: gloo, DS_ACCELERATOR=cpu); under torchrun / the deepspeed
launcher every rank runs the same code (`k2post.train.distributed`). Per optimizer step: set the lr of the
schedule, run this rank's micro-batches (forward without attention mask, restarting
position ids = block-causal attention per packed dialogue), sum the token cross-entropy,
normalize by the step's label tokens over all ranks (so the gradient is that of the token
mean over the global batch), `engine.backward` / `engine.step`, then QK-Clip on the fp32
masters (`apply_qk_clip_zero`). Eval loss (token mean over the held-out rows), checkpoints and
metrics rows follow the `train` config. Outputs in `run_dir`: config.yaml, data_report.json,
metrics.jsonl, checkpoints/step-N, final/ and summary.json (docs/SFT.md). Each row carries `perf/tokens_per_s`
(the step's real tokens, all ranks, over its wall time) and `perf/mfu` (k2post/train/mfu.py: 3 x forward FLOPs of
those tokens, attention at each packed dialogue's causal length, over the peak FLOP/s x ranks).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from k2post.config.loader import dump_yaml
from k2post.models.loading import ensure_model, load_causal_lm, load_tokenizer
from k2post.optim.deepspeed_muon import apply_qk_clip_zero, deepspeed_initialize
from k2post.quant.qat import install_qat
from k2post.optim.qk_clip import MaxLogitRecorder, recording_real_tokens
from k2post.train import checkpoint as ckpt
from k2post.sft.batching import BatchPlan, BatchShape
from k2post.sft.config import SFTConfig
from k2post.sft.data import SFTData, load_sft_data
from k2post.train.metrics import MetricsLog, ProgressDisplay, read_metrics
from k2post.train.mfu import causal_context, mfu, peak_flops, train_flops_per_token
from k2post.models.stats import matrix_flops_per_token
from k2post.sft.packing import IGNORE_INDEX, PackedRow, check_packed_attention, collate, model_inputs, pack_examples
from k2post.train.distributed import DistInfo, all_reduce_sum, barrier, init_distributed, shutdown_distributed
from k2post.train.schedule import lr_factor, set_lr

logger = logging.getLogger(__name__)


class RunDirError(ValueError):
    """The run dir holds an earlier run and `resume` is off."""


@dataclass
class SFTRun:
    """Everything one training run holds."""

    cfg: SFTConfig
    dist: DistInfo
    run_dir: Path
    tokenizer: Any
    data: SFTData
    plan: BatchPlan
    eval_rows: list[PackedRow]
    total_steps: int
    engine: Any
    recorder: MaxLogitRecorder | None
    metrics: MetricsLog
    state: ckpt.TrainerState
    step_times: list[float] = field(default_factory=list)  # this invocation's steps
    step_tokens: list[int] = field(default_factory=list)
    matrix_flops: int = 0  # forward matmul FLOPs per token of the model (k2post.models.stats)
    peak: tuple[float, str] = (0.0, "")  # peak FLOP/s of one rank's device, and where it comes from


# --------------------------------------------------------------------------- setup


def prepare_run_dir(cfg: SFTConfig, dist: DistInfo) -> Path:
    """Create run_dir (refusing an earlier run unless resuming) and write the resolved config."""
    run_dir = Path(cfg.run_dir)
    earlier = (run_dir / "metrics.jsonl").exists() or bool(ckpt.complete_checkpoints(run_dir))
    if earlier and not cfg.resume:
        raise RunDirError(
            f"run_dir {cfg.run_dir!r} already holds a run (metrics.jsonl / checkpoints): continue it with "
            f"`k2post sft --resume {cfg.run_dir}` (or `resume: auto`), or pick another run_dir"
        )
    if dist.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(dump_yaml(cfg))
    barrier()
    return run_dir


def model_dir_and_tokenizer(cfg: SFTConfig, dist: DistInfo) -> tuple[Path, Any]:
    """The model dir (rank 0 builds a missing flavor first) and its tokenizer."""
    if dist.is_main:
        ensure_model(cfg.model)
    barrier()
    model_dir = ensure_model(cfg.model)
    return model_dir, load_tokenizer(model_dir)


def load_data(cfg: SFTConfig, tokenizer: Any, run_dir: Path, dist: DistInfo) -> SFTData:
    """Load and split the dataset; rank 0 writes data_report.json."""
    data = load_sft_data(cfg.data, tokenizer)
    if dist.is_main:
        (run_dir / "data_report.json").write_text(json.dumps(data.report.to_json(), indent=2) + "\n")
    return data


def deepspeed_config(cfg: SFTConfig, world_size: int) -> dict[str, Any]:
    """The DeepSpeed config: batch shape, ZeRO stage, precision, then `deepspeed.extra` merged over it."""
    train = cfg.train
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": train.micro_batch_size,
        "gradient_accumulation_steps": train.gradient_accumulation_steps,
        "train_batch_size": train.micro_batch_size * train.gradient_accumulation_steps * world_size,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": cfg.deepspeed.zero_stage},
        "bf16": {"enabled": cfg.deepspeed.precision == "bf16"},
        "steps_per_print": 10**9,
    }
    return _merge(config, cfg.deepspeed.extra)


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`base` with `extra` merged in (nested dicts merged key by key)."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def build_engine(cfg: SFTConfig, model: Any, world_size: int) -> tuple[Any, MaxLogitRecorder | None]:
    """The DeepSpeed engine with a bound ZeroMuonClip, and the QK-Clip max-logit recorder (if on)."""
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    engine, _ = deepspeed_initialize(model, cfg.optim, deepspeed_config(cfg, world_size))
    recorder = MaxLogitRecorder().attach(engine.module) if cfg.optim.qk_clip.enabled else None
    if cfg.data.packing:
        check_packed_attention(engine.module)
    return engine, recorder


def build_run(cfg: SFTConfig, dist: DistInfo) -> SFTRun:
    """Run dir, model, data, batch plan and engine, ready for step 0."""
    run_dir = prepare_run_dir(cfg, dist)
    torch.manual_seed(cfg.train.seed)
    model_dir, tokenizer = model_dir_and_tokenizer(cfg, dist)
    data = load_data(cfg, tokenizer, run_dir, dist)  # before the weights: a data error fails fast
    model = load_causal_lm(model_dir, cfg.model.dtype).train()
    install_qat(model, cfg.qat)  # INT4 fake quant in the forward (off by default)
    matrix_flops = matrix_flops_per_token(model)  # before DeepSpeed (ZeRO-3 would shard the params)
    shape = BatchShape(cfg.train.micro_batch_size, cfg.train.gradient_accumulation_steps, dist.world_size)
    plan = BatchPlan(data.train, cfg.data.max_seq_len, shape, cfg.train.seed, cfg.data.packing)
    total = cfg.train.max_steps or plan.steps_for_epochs(cfg.train.epochs)
    engine, recorder = build_engine(cfg, model, dist.world_size)
    state = ckpt.TrainerState(0, total, 0, 0, plan.fingerprint(), dist.world_size, cfg.deepspeed.zero_stage)
    eval_rows = pack_examples(data.eval, cfg.data.max_seq_len, cfg.data.packing) if data.eval else []
    metrics = MetricsLog(run_dir / "metrics.jsonl", enabled=dist.is_main)
    run = SFTRun(cfg, dist, run_dir, tokenizer, data, plan, eval_rows, total, engine, recorder, metrics, state)
    run.matrix_flops, run.peak = matrix_flops, peak_flops(engine.device, cfg.model.dtype)
    return run


# --------------------------------------------------------------------------- steps


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of next-token cross-entropy over labelled positions (logits [B, L, V], labels [B, L], fp32)."""
    shifted = labels[:, 1:].reshape(-1)
    flat = logits[:, :-1].reshape(-1, logits.shape[-1]).float()
    return F.cross_entropy(flat, shifted, ignore_index=IGNORE_INDEX, reduction="sum")


def pad_id(tokenizer: Any) -> int:
    """Id used for padding (its value never matters: padding has labels -100 and its own attention block)."""
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if candidate is not None:
            return int(candidate)
    return 0


def train_step(run: SFTRun, step: int) -> dict[str, Any]:
    """One optimizer step (this rank's micro-batches) -> the metrics row of step `step + 1`."""
    start = time.perf_counter()
    lr = run.cfg.optim.lr * lr_factor(step, run.total_steps, run.cfg.schedule)
    set_lr(run.engine, lr)
    total_labels = run.plan.step_label_tokens(step)
    scale = run.plan.shape.micro_batches_per_step / total_labels  # DeepSpeed averages over gas and ranks
    loss_sum = 0.0
    for rows in run.plan.rank_micro_batches(step, run.dist.rank):
        batch = collate(rows, pad_id(run.tokenizer))
        with recording_real_tokens(run.recorder, batch["token_valid"]):  # S_max of QK-Clip skips padding
            loss = token_loss_sum(run.engine(**model_inputs(batch)).logits, batch["labels"])
        run.engine.backward(loss * scale)
        run.engine.step()
        loss_sum += float(loss.detach())
    qk_metrics = _qk_clip(run)
    (loss_sum,) = all_reduce_sum([loss_sum])
    rows = [row for batch in run.plan.step_micro_batches(step) for row in batch]
    seconds = time.perf_counter() - start
    row = _step_row(run, step, loss_sum / total_labels, lr, sum(map(len, rows)), total_labels, seconds, qk_metrics)
    return {**row, **perf_metrics(run, [n for r in rows for n in r.lengths], seconds)}


def perf_metrics(run: SFTRun, lengths: list[int], seconds: float) -> dict[str, float]:
    """`perf/tokens_per_s` and `perf/mfu` of a step over packed dialogues of these lengths (all ranks)."""
    tokens_per_s = sum(lengths) / max(seconds, 1e-9)
    per_token = train_flops_per_token(run.engine.module, causal_context(lengths), run.matrix_flops)
    return {
        "perf/tokens_per_s": tokens_per_s,
        "perf/mfu": mfu(tokens_per_s, per_token, run.peak[0] * run.dist.world_size),
    }


def _qk_clip(run: SFTRun) -> dict[str, float]:
    """QK-Clip after the step (every rank), as metrics."""
    if run.recorder is None:
        return {}
    return apply_qk_clip_zero(run.engine, run.recorder, run.cfg.optim.qk_clip.logit_threshold).to_metrics()


def _step_row(
    run: SFTRun, step: int, loss: float, lr: float, tokens: int, labels: int, seconds: float, qk: dict[str, float]
) -> dict[str, Any]:
    """Update the counters and build the metrics row of step `step + 1`."""
    run.state.step, run.state.tokens, run.state.label_tokens = (
        step + 1,
        run.state.tokens + tokens,
        run.state.label_tokens + labels,
    )
    run.step_times.append(seconds)
    run.step_tokens.append(tokens)
    row = {
        "step": step + 1,
        "epoch": round(run.plan.epoch_of_step(step + 1), 4),
        "loss": loss,
        "lr": lr,
        "tokens": tokens,
        "label_tokens": labels,
        "tokens_total": run.state.tokens,
        "step_time_s": round(seconds, 4),
        "tokens_per_s": tokens / max(seconds, 1e-9),
    }
    return {**row, **qk}


@torch.no_grad()
def evaluate(run: SFTRun) -> tuple[float, int]:
    """(token-mean loss, label tokens) over the held-out rows; every rank runs the same number of forwards."""
    size, world = run.cfg.train.eval_batch_size, run.dist.world_size
    batches = [run.eval_rows[i : i + size] for i in range(0, len(run.eval_rows), size)]
    run.engine.eval()
    loss_sum, count = 0.0, 0
    try:
        for index in range(run.dist.rank, -(-len(batches) // world) * world, world):
            rows = batches[index] if index < len(batches) else batches[0]  # a spare forward keeps ZeRO-3 in step
            batch = collate(rows, pad_id(run.tokenizer))
            with run.recorder.paused() if run.recorder is not None else contextlib.nullcontext():
                loss = float(token_loss_sum(run.engine(**model_inputs(batch)).logits, batch["labels"]))
            if index < len(batches):
                loss_sum, count = loss_sum + loss, count + sum(row.num_label_tokens for row in rows)
    finally:
        run.engine.train()
    loss_sum, count = all_reduce_sum([loss_sum, float(count)])
    return loss_sum / max(count, 1.0), int(count)


def eval_row(run: SFTRun) -> dict[str, Any]:
    """{eval_loss, eval_tokens} now (empty without held-out rows)."""
    if not run.eval_rows:
        return {}
    loss, tokens = evaluate(run)
    run.state.eval_loss = loss
    return {"eval_loss": loss, "eval_tokens": tokens}


# --------------------------------------------------------------------------- checkpoints


def save_checkpoint(run: SFTRun, step: int) -> Path:
    """Write checkpoints/step-N atomically (HF model + tokenizer + engine + RNG + state), prune old ones."""

    def write(tmp: Path) -> None:
        run.engine.save_checkpoint(str(tmp / ckpt.ENGINE_DIR), tag=ckpt.ENGINE_TAG)
        ckpt.save_rng(tmp, run.dist.rank)
        ckpt.save_hf(run.engine.module, run.tokenizer, tmp, run.cfg.deepspeed.zero_stage, run.dist.is_main)
        if run.dist.is_main:
            run.state.write(tmp)

    path = ckpt.write_atomically(ckpt.checkpoint_dir(run.run_dir, step), run.dist, write)
    if run.dist.is_main:
        ckpt.prune_checkpoints(run.run_dir, run.cfg.checkpoint.keep)
    return path


def write_final(run: SFTRun) -> Path:
    """Write run_dir/final atomically: the HF model + tokenizer vLLM loads, and trainer_state.json."""

    def write(tmp: Path) -> None:
        ckpt.save_hf(run.engine.module, run.tokenizer, tmp, run.cfg.deepspeed.zero_stage, run.dist.is_main)
        if run.dist.is_main:
            run.state.write(tmp)

    return ckpt.write_atomically(run.run_dir / "final", run.dist, write)


def resume(run: SFTRun) -> int:
    """Load the newest complete checkpoint when `resume` is on; returns the step to start from."""
    latest = ckpt.latest_checkpoint(run.run_dir) if run.cfg.resume else None
    if latest is None:
        run.metrics.truncate_after(-1)  # a run that died before its first checkpoint starts over
        return 0
    state = ckpt.TrainerState.read(latest)
    ckpt.check_resumable(state, run.state.fingerprint, run.dist.world_size, run.cfg.deepspeed.zero_stage, latest)
    ckpt.load_engine_state(run.engine, latest)
    ckpt.load_rng(latest, run.dist.rank)
    run.state.step, run.state.tokens, run.state.label_tokens = state.step, state.tokens, state.label_tokens
    run.state.eval_loss = state.eval_loss
    run.metrics.truncate_after(state.step)
    return state.step


# --------------------------------------------------------------------------- loop


def _due(step: int, every: int, last: int) -> bool:
    """True every `every` steps (0: never) and at `last`."""
    return step == last or (every > 0 and step % every == 0)


def train_loop(run: SFTRun, start: int, display: ProgressDisplay) -> int:
    """Steps start..end (end = total or stop_at_step) with evals, metrics and checkpoints; returns end."""
    train = run.cfg.train
    end = min(run.total_steps, train.stop_at_step or run.total_steps)
    if start == 0 and train.eval_at_start and run.eval_rows:
        first = {"step": 0, **eval_row(run)}
        run.metrics.append(first)
        display.print(f"step 0/{run.total_steps} eval {first['eval_loss']:.4f}")
    for step in range(start, end):
        row = train_step(run, step)
        if _due(step + 1, train.eval_every, end):
            row.update(eval_row(run))
        run.metrics.append(row)
        display.update(row, run.total_steps)
        if _due(step + 1, run.cfg.checkpoint.every, end):
            save_checkpoint(run, step + 1)
    return max(start, end)


def summarize(run: SFTRun, start: int, end: int, wall_s: float, final: Path | None) -> dict[str, Any]:
    """summary.json: eval loss before/after, losses, timings, data counts (written by rank 0)."""
    rows = read_metrics(run.metrics.path) if run.dist.is_main else []
    evals = [r["eval_loss"] for r in rows if r.get("eval_loss") is not None]
    losses = [r["loss"] for r in rows if "loss" in r]
    times = run.step_times[1:] or run.step_times  # the first step pays one-time warm-up
    report = run.data.report.to_json()
    summary = {
        "completed": final is not None,
        "steps": end,
        "total_steps": run.total_steps,
        "resumed_from": start if run.cfg.resume and start > 0 else None,
        "eval_loss_start": evals[0] if evals else None,
        "eval_loss_end": evals[-1] if evals else None,
        "train_loss_first": losses[0] if losses else None,
        "train_loss_last": losses[-1] if losses else None,
        "mean_step_time_s": sum(times) / len(times) if times else None,
        "tokens_per_s": sum(run.step_tokens) / max(sum(run.step_times), 1e-9) if run.step_times else None,
        "mfu_mean": _mean([r["perf/mfu"] for r in rows if r.get("perf/mfu") is not None][1:]),
        "peak_flops": run.peak[0],
        "peak_source": run.peak[1],
        "wall_s": round(wall_s, 2),
        "final_dir": str(final) if final else None,
        "data": {k: report[k] for k in ("rows", "train_examples", "eval_examples", "num_bad_rows", "train_tokens")},
    }
    if run.dist.is_main:
        (run.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _mean(values: list[float]) -> float | None:
    """The mean of `values` (None for none)."""
    return sum(values) / len(values) if values else None


def _train(cfg: SFTConfig, dist: DistInfo) -> dict[str, Any]:
    """Build, resume, loop, write the final model and the summary."""
    t0 = time.perf_counter()
    run = build_run(cfg, dist)
    start = resume(run)
    display = ProgressDisplay(run.total_steps, start, cfg.train.log_every, cfg.train.progress_bar, dist.is_main)
    display.print(
        f"sft: {len(run.data.train)} train / {len(run.data.eval)} eval dialogues, "
        f"{run.plan.epoch_length(0)} packed rows per epoch, steps {start}..{run.total_steps}"
    )
    display.print(f"sft: MFU against {run.peak[0] / 1e12:.3g} TFLOP/s per rank ({run.peak[1]})")
    if start > 0:
        display.print(f"sft: resuming from {ckpt.checkpoint_dir(run.run_dir, start)} (step {start})")
    elif cfg.resume:
        display.print(f"sft: resume: {cfg.resume}, but no checkpoint in {run.run_dir} yet: starting fresh")
    try:
        end = train_loop(run, start, display)
    finally:
        display.close()
    final = write_final(run) if end >= run.total_steps else None
    return summarize(run, start, end, time.perf_counter() - t0, final)


def run_sft(cfg: SFTConfig) -> dict[str, Any]:
    """Run SFT as configured (this process is one rank); returns the summary."""
    dist = init_distributed(cfg.deepspeed.dist_backend)
    try:
        return _train(cfg, dist)
    finally:
        shutdown_distributed(dist)
