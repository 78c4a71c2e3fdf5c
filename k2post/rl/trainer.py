"""One RL trainer rank: DeepSpeed + ZeroMuonClip on the K1.5 + PTX loss, and the weight sender.

The controller (`pipelines/rl.py`) starts `world_size` of these as Ray actors (`RLTrainerWorker`
is the plain class) and drives them in lock step: every method below that touches the model is
collective over the ranks (gloo on CPU, nccl on GPU), so the controller calls it on all ranks
at once. Per iteration:

    old = worker.old_policy(rows)                     # pi_old per model token (+ routing agreement with the engine)
    row = worker.train_step(micro_batches, step)      # K1.5 (+ PTX) -> engine.backward/step -> QK-Clip
    worker.push_weights()                             # checkpoint engine -> this rank's rollout actor

Rank r's `WeightSender` serves rollout replica r (every rank holds every bucket after the
broadcast); ZeRO 0-2 keep full module params on each rank, which are registered live; under ZeRO-3 each served
tensor is gathered collectively, one parameter at a time, as the push reaches it (`k2post.rl.served_weights`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

from k2post.train.memory import peak_rss_mib, rss_mib
from k2post.rl.batch import TrainSequence, episode_index, kept_episodes, micro_batches, micro_loss_scale, pad_rows
from k2post.optim.qk_clip import recording_real_tokens
from k2post.rl.losses import (
    episode_residuals,
    logits_window,
    masked_token_lists,
    ptx_loss,
    sequence_logprob,
    tail_logprobs,
    temper,
    token_entropy,
    weight_matrix,
)
from k2post.rl.routing_replay import RoutingReplay, RoutingStats, moe_gates, recorded_batch
from k2post.rl.ptx_rows import load_ptx_rows
from k2post.rl.run_config import RLConfig

log = logging.getLogger(__name__)

# What `_micro_loss` / `train_step` add up over a step's micro-batches (this rank).
STEP_SUMS = ("loss", "ptx", "entropy", "response_tokens", "logratio_abs_sum", "logratio_abs", "grad_norm", "episodes")


def _move_optimizer_state(optimizer: Any, device: Any) -> None:
    """Every tensor in the optimizer's per-param state to `device` (ZeRO 0 offload)."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if torch.is_tensor(value):
                state[key] = value.to(device, non_blocking=True)


LAUNCHER_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def _set_dist_env(rank: int, world_size: int, master_port: int) -> dict[str, str | None]:
    """Set this rank's launcher variables; returns their previous values (None: unset) for `_restore_env`."""
    before = {key: os.environ.get(key) for key in LAUNCHER_KEYS}
    os.environ.update(
        {
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(master_port),
            "TORCHDYNAMO_DISABLE": "1",
        }
    )
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    return before


def _restore_env(before: dict[str, str | None]) -> None:
    """Put the launcher variables back, so a child process started later does not reuse a stale MASTER_PORT."""
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def deepspeed_config(cfg: RLConfig) -> dict[str, Any]:
    """DeepSpeed config of the trainer: fixed forwards per step, no clipping, the configured ZeRO stage."""
    gas, zero = cfg.gradient_accumulation_steps(), {"stage": cfg.trainer.zero_stage}
    if cfg.trainer.zero_stage == 3:
        limits = cfg.trainer.zero3
        zero.update({
            "stage3_prefetch_bucket_size": limits.prefetch_bucket_numel,
            "stage3_max_live_parameters": limits.max_live_numel,
            "stage3_param_persistence_threshold": limits.persistence_threshold_numel,
            "stage3_max_reuse_distance": limits.max_reuse_distance,
            "reduce_bucket_size": limits.reduce_bucket_numel,
        })  # fmt: skip
    return {
        "train_micro_batch_size_per_gpu": cfg.loss.micro_batch_size,
        "gradient_accumulation_steps": gas,
        "train_batch_size": cfg.loss.micro_batch_size * gas * cfg.trainer.world_size,
        "gradient_clipping": 0.0,
        "zero_optimization": zero,
        "steps_per_print": 10**9,
    }


class RLTrainerWorker:
    """One trainer rank (a Ray actor in the run; usable directly in one process)."""

    def __init__(self, cfg: RLConfig, model_dir: str, rank: int, master_port: int) -> None:
        self._env_before = _set_dist_env(rank, cfg.trainer.world_size, master_port)
        torch.set_num_threads(cfg.trainer_threads())  # Ray sets OMP_NUM_THREADS=1 for fractional-CPU actors
        torch.manual_seed(cfg.seed)
        self.cfg, self.rank, self.world_size = cfg, rank, cfg.trainer.world_size
        self.model_dir = model_dir
        self._init_engine()
        self.ptx_rows = self._load_ptx()
        self.sender = None
        self._sources: list[Any] = []  # ZeRO-3: the served tensors' collective materializers
        self.offloaded = False

    # ------------------------------------------------------------------ setup

    def _init_engine(self) -> None:
        from k2post.models.loading import load_causal_lm, load_tokenizer
        from k2post.optim.deepspeed_muon import deepspeed_initialize
        from k2post.optim.qk_clip import MaxLogitRecorder
        from k2post.quant.qat import install_qat
        from k2post.train.distributed import init_distributed

        self.dist = init_distributed(self.cfg.trainer.dist_backend)
        self.tokenizer = load_tokenizer(self.model_dir)
        model = load_causal_lm(self.model_dir, "float32").train()
        qat = install_qat(
            model, self.cfg.qat
        )  # INT4 fake quant of the target weights in every forward (off by default)
        self.qat_names = {f"{module}.{param}" for module, params in qat.items() for param in params}
        optim = self.cfg.optim
        if self.cfg.lora.enabled:  # frozen base + adapters, which AdamW updates (k2post.train.lora says why)
            from k2post.train.lora import apply_lora, lora_optim

            model, optim = apply_lora(model, self.cfg.lora), lora_optim(optim)
        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
        self.engine, self.optimizer = deepspeed_initialize(model, optim, deepspeed_config(self.cfg))
        self.recorder = MaxLogitRecorder().attach(self.engine.module) if self.cfg.optim.qk_clip.enabled else None
        self.pad_id = int(
            self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        )
        # recorded routing is compared on every MoE model and forced with routing_replay (pi_old and the loss)
        replay_or_moe = self.cfg.routing_replay or moe_gates(self.engine.module)
        self.routing = RoutingReplay(self.engine.module) if replay_or_moe else None

    def _load_ptx(self) -> list[Any]:
        if self.cfg.loss.ptx_coef == 0:
            return []
        return load_ptx_rows(self.cfg.loss, self.tokenizer, self.cfg.rollout.engine.max_model_len, self.cfg.seed)

    def _make_sender(self):
        from k2post_checkpoint_engine import CheckpointEngineConfig, WeightSender

        config = CheckpointEngineConfig(
            bucket_nbytes=self.cfg.trainer.bucket_mb << 20,
            timeout_s=300.0,
            device="cuda" if torch.cuda.is_available() else "cpu",
        )
        serve = self.rank < self.cfg.rollout.replicas  # rank r feeds replica r; the others only broadcast
        sender = WeightSender(config, rank=self.rank, world_size=self.world_size, serve=serve)
        if self.cfg.trainer.zero_stage == 3:
            self._register_zero3(sender)
            return sender
        if self.cfg.lora.enabled and self.cfg.lora.push == "adapter":  # only A and B of every target
            from k2post.train.lora import adapter_state

            self._served = sorted(adapter_state(self.engine.module).items())
            for name, tensor in self._served:
                sender.register(name, tensor, owner=0)
            return sender
        from k2post.rl.served_weights import served_tensors

        self._served = served_tensors(self.engine.module, self.cfg.qat, self.cfg.lora.enabled)  # for the digests
        for name, tensor in self._served:  # HF checkpoint names: what vLLM loads
            sender.register(name, tensor, owner=0)
        return sender

    def _register_zero3(self, sender: Any) -> None:
        """ZeRO-3: one collective materializer per served tensor (gathered bucket by bucket during the push,
        `k2post.rl.served_weights`); the unpartitioned buffers are registered as they are."""
        from k2post.rl.served_weights import zero3_sources

        self._sources, self._served = zero3_sources(self.engine.module, self.qat_names, self.cfg.qat.group_size)
        for source in self._sources:
            sender.register(source.name, source.materialize, shape=source.shape, dtype=source.dtype, collective=True)
        for name, tensor in self._served:
            sender.register(name, tensor, owner=0)

    def ready(self) -> dict[str, Any]:
        """Facts for the controller: sender address, param count, pid, memory."""
        from k2post.rl.served_weights import full_numel

        params = list(self.engine.module.parameters())
        n_params, trainable = sum(map(full_numel, params)), sum(full_numel(p) for p in params if p.requires_grad)
        return {"rank": self.rank, "params": n_params, "trainable_params": trainable, "pid": os.getpid(),
                "rss_mib": rss_mib()}  # fmt: skip

    # ------------------------------------------------------------------ forward passes

    def _forward(
        self, rows: list[TrainSequence], routing: RoutingStats | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Logits of the trailing positions that predict trained tokens [B, L, V] (`logits_window`: the
        prompt-only positions before them need no LM head or softmax), divided by each row's sampling temperature
        (`temper`: pi is the distribution the engine sampled), input ids [B, T] and loss mask [B, T]
        of a micro-batch (right-padded). Rows with a recorded routing are compared with (and, with
        routing_replay, routed like) the engine; the counts go into `routing`.

        QK-Clip's recorder counts only the real tokens: the trainer passes no attention mask, and
        right padding is harmless to causal attention but would enter S_max."""
        ids, masks = pad_rows([r.token_ids for r in rows], [r.loss_mask for r in rows], self.pad_id)
        input_ids = torch.tensor(ids, dtype=torch.long, device=self.engine.device)
        mask = torch.tensor(masks, dtype=torch.float32, device=self.engine.device)
        lengths = torch.tensor([len(r.token_ids) for r in rows], device=self.engine.device)
        valid = torch.arange(input_ids.shape[1], device=self.engine.device)[None, :] < lengths[:, None]  # [B, T]
        with recording_real_tokens(self.recorder, valid), self._routing(rows, valid, routing):
            logits = self.engine(input_ids=input_ids, use_cache=False, logits_to_keep=logits_window(mask)).logits
        temperatures = torch.tensor([r.temperature for r in rows], device=logits.device)
        return temper(logits, temperatures), input_ids, mask

    @contextlib.contextmanager
    def _routing(self, rows: list[TrainSequence], valid: torch.Tensor, into: RoutingStats | None):
        """The engine's recorded experts for this batch: compared always, forced with routing_replay."""
        recorded = None
        if self.routing is not None:
            recorded = recorded_batch(
                [r.routing for r in rows], valid.shape[1], len(self.routing.layers), self.routing.top_k
            )
        if recorded is None:
            yield
            return
        with self.routing.forcing(recorded, valid.cpu(), replay=self.cfg.routing_replay) as stats:
            yield
        if into is not None:
            into.add(stats)

    @torch.no_grad()
    def old_policy(self, rows: list[TrainSequence]) -> dict[str, Any]:
        """pi_old for this iteration (the current weights): each row's model-token log-probs, in order, and how
        often this forward's expert choice differed from the engine's (`RoutingStats` fields)."""
        tokens: list[list[float]] = []
        routing = RoutingStats()
        recording = self.recorder.paused() if self.recorder is not None else contextlib.nullcontext()
        with recording:  # micro-batches of episodes: the same number of forwards on every rank (ZeRO-3 gathers)
            for batch in micro_batches(rows, self.cfg.loss.micro_batch_size):
                logits, input_ids, mask = self._forward(batch, routing)
                tokens.extend(masked_token_lists(tail_logprobs(logits, input_ids), mask))
        return {"token_logprobs": tokens, "routing": vars(routing)}

    def sequence_logprobs(self, rows: list[TrainSequence]) -> list[float]:
        """log pi(y|x) per row under the current weights (the sum of `old_policy`'s token log-probs)."""
        return [float(sum(row)) for row in self.old_policy(rows)["token_logprobs"]]

    def _micro_loss(
        self, rows: list[TrainSequence], old: list[float], scale: float, sums: dict[str, float]
    ) -> torch.Tensor:
        """scale * sum_e m_e residual_e^2 of one micro-batch's episodes (`episode_residuals`: one residual per
        episode, its log-ratio summed over its context windows); folds diagnostics into `sums`."""
        logits, input_ids, mask = self._forward(rows)
        weights = weight_matrix(mask, [r.token_weights for r in rows])  # IS weights (1 without the correction)
        seq_logp = sequence_logprob(tail_logprobs(logits, input_ids), weights)  # [B] rows
        device = seq_logp.device
        episodes = [r for r in rows if not r.extra_window]
        residual, logratio = episode_residuals(
            seq_logp,
            torch.tensor(old, device=device),
            torch.tensor(episode_index(rows), device=device),
            torch.tensor([r.advantage for r in episodes], device=device),
            self.cfg.loss.tau,
        )
        keep = torch.tensor([float(r.keep) for r in episodes], device=device)  # the IS mask, per episode
        residual_sq = (residual.pow(2) * keep).sum()
        with torch.no_grad():
            response = mask[
                :, mask.shape[1] - logits.shape[1] + 1 :
            ]  # [B, L-1]: the tail positions that predicted a model-written token
            sums["entropy"] += float((token_entropy(logits[:, :-1]) * response).sum())
            sums["response_tokens"] += float(response.sum())
            sums["loss"] += float(residual_sq)
            sums["logratio_abs_sum"] += float((logratio.abs() * keep).sum())
            sums["logratio_abs"] = max(sums["logratio_abs"], float((logratio.abs() * keep).max()))
        return residual_sq * scale

    def _backward(
        self, micro: list[list[TrainSequence]], logp_old: list[list[float]], step: int, sums: dict[str, float]
    ) -> None:
        """Forward + backward of every micro-batch, `engine.step()` after each but the last (the caller's).
        The loss is the mean over the step's kept episodes (N counts no masked one), summed over the ranks."""
        from k2post.train.distributed import all_reduce_sum

        gas = len(micro)
        sums["episodes"] = all_reduce_sum([float(sum(kept_episodes(m) for m in micro))])[0]
        scale = micro_loss_scale(max(int(sums["episodes"]), 1), self.world_size, gas)
        for index, (rows, old) in enumerate(zip(micro, logp_old)):
            loss = self._micro_loss(rows, old, scale, sums)
            if index == gas - 1 and self.ptx_rows:
                ptx = self._ptx_loss(step)
                loss = loss + self.cfg.loss.ptx_coef * ptx * gas  # DeepSpeed divides by gas: coef * ptx in the gradient
                sums["ptx"] = float(ptx.detach())
            self.engine.backward(loss)
            if index < gas - 1:
                self.engine.step()

    def train_step(self, micro: list[list[TrainSequence]], logp_old: list[list[float]], step: int) -> dict[str, Any]:
        """One optimizer step over this rank's micro-batches (K1.5 residuals + PTX on the last)."""
        started = time.perf_counter()
        self._set_lr(step)
        sums = dict.fromkeys(STEP_SUMS, 0.0)
        self._backward(micro, logp_old, step, sums)
        plain_norm = self._plain_grad_norm()
        self.optimizer.update_stats.reset()
        self.engine.step()
        sums["grad_norm"] = plain_norm if plain_norm is not None else float(self.engine.get_global_grad_norm() or 0.0)
        qk = self._qk_clip()
        return self._step_metrics(sums, max(sums["episodes"], 1.0), qk, time.perf_counter() - started)

    def loss_gradient(
        self, micro: list[list[TrainSequence]], logp_old: list[list[float]], step: int
    ) -> dict[str, torch.Tensor]:
        """The full gradient of the step's loss by param name, as `train_step` would apply it (ZeRO 0-2).

        Runs the same forwards and backwards and leaves the optimizer step out; for tests (the worker
        is not meant to train afterwards)."""
        from deepspeed.utils import safe_get_full_grad

        self._set_lr(step)
        self._backward(micro, logp_old, step, dict.fromkeys(STEP_SUMS, 0.0))
        out = {}
        for name, param in self.engine.module.named_parameters():
            grad = param.grad if self.cfg.trainer.zero_stage == 0 else safe_get_full_grad(param)
            out[name] = grad.detach().float().cpu().clone()
        return out

    def _plain_grad_norm(self) -> float | None:
        """L2 norm of the reduced gradient at ZeRO 0 (module grads before the step); None under ZeRO,
        where DeepSpeed computes it in the step (`get_global_grad_norm`)."""
        if self.cfg.trainer.zero_stage != 0:
            return None
        norms = [p.grad.detach().float().norm() for p in self.engine.module.parameters() if p.grad is not None]
        return float(torch.stack(norms).norm()) if norms else 0.0

    def _set_lr(self, step: int) -> float:
        """optim.lr x the loop's schedule at optimizer step `step` (a function of the step: resume needs nothing
        else).
        """
        from k2post.train.schedule import lr_factor, set_lr

        total = self.cfg.total_optimizer_steps()
        self.lr = self.cfg.optim.lr * lr_factor(min(step, total - 1), total, self.cfg.schedule)
        set_lr(self.engine, self.lr)
        return self.lr

    def _ptx_loss(self, step: int) -> torch.Tensor:
        from k2post.sft.packing import collate, model_inputs

        n = self.cfg.loss.ptx_rows_per_step
        first = (step * self.world_size + self.rank) * n
        rows = [self.ptx_rows[(first + j) % len(self.ptx_rows)] for j in range(n)]
        batch = collate(rows, self.pad_id)
        with recording_real_tokens(self.recorder, batch["token_valid"]):
            logits = self.engine(**model_inputs(batch)).logits
        return ptx_loss(logits, batch["labels"].to(logits.device))

    def _qk_clip(self) -> dict[str, float]:
        if self.recorder is None:
            return {}
        from k2post.optim.deepspeed_muon import apply_qk_clip_zero

        return apply_qk_clip_zero(self.engine, self.recorder, self.cfg.optim.qk_clip.logit_threshold).to_metrics()

    def _step_metrics(self, sums: dict[str, float], total: int, qk: dict[str, float], seconds: float) -> dict[str, Any]:
        from k2post.train.distributed import all_reduce_sum

        stats = self.optimizer.update_stats
        loss_sum, ptx_sum, ent, tokens, lr_abs, sq, numel = all_reduce_sum(
            [
                sums["loss"],
                sums["ptx"],
                sums["entropy"],
                sums["response_tokens"],
                sums["logratio_abs_sum"],
                stats.sq_sum,
                float(stats.numel),
            ]
        )
        row = {
            "train/k15_loss": loss_sum / total,
            "train/episodes": sums["episodes"],  # N: the step's episodes the IS mask kept (all ranks)
            "train/logratio_abs_max": sums["logratio_abs"],
            "train/lr": self.lr,
            "train/logratio_abs_mean": lr_abs / total,
            "train/entropy": ent / max(tokens, 1.0),
            "train/grad_norm": sums["grad_norm"],
            "train/muon_update_rms": (sq / numel) ** 0.5 if numel else 0.0,
            "time/trainer_step_s": seconds,
        }
        if self.ptx_rows:
            row["train/ptx_loss"] = ptx_sum / self.world_size
        return {**row, **qk}

    # ------------------------------------------------------------------ weights, memory, checkpoints

    def open_push(self) -> str | None:
        """A fresh sender for the next push; returns its address for the rollout actor to connect to.

        The engine side opens one `WeightReceiver` per update (`VLLMEngine.receive_update`), so
        each push gets its own listener and IPC slots (cheap: one socket, two shm segments)."""
        if self.sender is not None:
            self.sender.close()
        self.sender = self._make_sender()
        return self.sender.address

    def push_weights(self, verify: bool = False) -> dict[str, Any]:
        """Stream the current weights to this rank's rollout actor (it must be receiving on `open_push`'s address);
        with `verify`, also the digest of every pushed tensor (compared with what the engine loaded)."""
        from k2post.rollout.weight_update import tensor_digests

        started = time.perf_counter()
        digests = tensor_digests(self._served) if verify else None  # ZeRO-3: the unpartitioned buffers
        for source in self._sources:  # ZeRO-3: each gathered tensor is hashed as it is materialized
            source.digests = digests
        checks = {"digests": digests}
        if verify and self.cfg.lora.enabled and self.cfg.lora.push == "adapter":
            checks["lora_adapter"] = True  # the engine must report the adapter registered
        elif verify and self.cfg.lora.enabled:  # the adapted weights the engine must not hold unmerged
            from k2post.train.lora import base_digests

            checks["lora_base_digests"] = base_digests(self.engine.module)
        digest_s = time.perf_counter() - started
        stats = self.sender.push()
        figures = {"nbytes": stats.nbytes, "seconds": stats.elapsed_s, "gb_per_s": stats.gb_per_s}
        return {**figures, **({**checks, "digest_s": digest_s} if verify else {})}

    def offload(self) -> dict[str, Any]:
        """Move params and optimizer state to DRAM while the engines generate (needs a device; on CPU they live there).

        ZeRO 1-2: DeepSpeed's `offload_states` (fp16/fp32 params, grads, optimizer state; pinned);
        ZeRO 0: the module and the optimizer's state tensors."""
        if not torch.cuda.is_available() or not self.cfg.trainer.offload_during_rollout:
            return {"offloaded": False, "reason": "no device: params and optimizer state already live in DRAM"}
        before = torch.cuda.memory_allocated()
        if self.cfg.trainer.zero_stage >= 1:
            self.engine.offload_states()
        else:
            self.engine.module.to("cpu")
            _move_optimizer_state(self.optimizer, "cpu")
        torch.cuda.empty_cache()
        self.offloaded = True
        return {"offloaded": True, "freed_mib": (before - torch.cuda.memory_allocated()) / 2**20}

    def reload(self) -> dict[str, Any]:
        """Bring offloaded params and optimizer state back to the device before training."""
        if not self.offloaded:
            return {"reloaded": False}
        if self.cfg.trainer.zero_stage >= 1:
            self.engine.reload_states()
        else:
            self.engine.module.to(self.engine.device)
            _move_optimizer_state(self.optimizer, self.engine.device)
        self.offloaded = False
        return {"reloaded": True}

    def memory(self) -> dict[str, float]:
        """RSS now and peak (MiB), and the device's peak when there is one."""
        out = {"rss_mib": rss_mib(), "peak_rss_mib": peak_rss_mib()}
        if torch.cuda.is_available():
            out["cuda_peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
        return out

    def save(self, directory: str) -> None:
        """Write the engine state (every rank), the HF model and tokenizer (rank 0) and RNG into `directory`."""
        from k2post.train import checkpoint as ckpt

        path = Path(directory)
        self.engine.save_checkpoint(str(path / ckpt.ENGINE_DIR), tag=ckpt.ENGINE_TAG)
        ckpt.save_rng(path, self.rank)
        if self.cfg.lora.enabled:  # the merged model (what the engines serve) + the adapter on its own
            from k2post.train.lora import save_merged

            save_merged(self.engine.module, self.tokenizer, path, self.rank == 0)
            return
        ckpt.save_hf(self.engine.module, self.tokenizer, path, self.cfg.trainer.zero_stage, self.rank == 0)

    def load(self, directory: str) -> None:
        """Restore what `save` wrote (same world size and ZeRO stage)."""
        from k2post.train import checkpoint as ckpt

        ckpt.load_engine_state(self.engine, Path(directory))
        ckpt.load_rng(Path(directory), self.rank)

    def close(self) -> None:
        """Close the sender and leave the process group."""
        from k2post.train.distributed import shutdown_distributed

        if self.sender is not None:
            self.sender.close()
        shutdown_distributed(self.dist)
        _restore_env(self._env_before)
