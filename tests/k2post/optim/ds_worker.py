"""One rank of the DeepSpeed ZeroMuonClip equality check (launched by test_deepspeed_muon.py).

Each rank builds the same small model (seed 0), takes its half of a fixed batch, and for
every (model, ZeRO stage 0-3) pair in one process group:
  A  trains STEPS steps with ZeroMuonClip through the DeepSpeed engine (fp32, no clipping);
  B  one more step followed by a forced QK-Clip (tau between the recorded per-head maxima);
  C  saves a DeepSpeed checkpoint, steps (C1), reloads the checkpoint and steps again (C2).
During A and B a `StepAudit` compares every step with MuonClip fed the same gathered params
and gradient. Rank 0 writes `{out}/{model}_zero{stage}.pt` with the full params after A, B,
C1, C2 (gathered from the model copy), tau, the clipped heads, the audit's max difference and
the max |fp32 master - model copy|.
The single-process reference (`reference_run`) lives here too, so both sides share builders.

Run by hand (2 ranks; DS_ACCELERATOR=cpu TORCHDYNAMO_DISABLE=1 MASTER_ADDR=127.0.0.1
MASTER_PORT=29512 WORLD_SIZE=2 and RANK=LOCAL_RANK=0 / 1 for the two processes):
    python tests/k2post/optim/ds_worker.py --out /tmp/dsm --stages 0,1,2,3 --models qwen2,k2
References (one process): python tests/k2post/optim/ds_worker.py --out /tmp/dsm --reference
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from pathlib import Path

import torch
from torch import nn

STEPS = 3
BATCH, SEQ, VOCAB = 4, 16, 256
MODELS = ("qwen2", "k2")


def optim_config():
    """The optimizer settings of both sides (lr large enough that params visibly move).

    bf16 NS: its rounding makes the batched (distributed) and per-tensor (reference) NS bit-identical; in fp32
    they differ by ~1 ulp of batched vs single GEMMs, which a bit-for-bit audit cannot tell from a bug."""
    from k2post.optim.config import OptimConfig

    return OptimConfig(lr=2e-3, weight_decay=0.1)


def build_small(kind: str) -> nn.Module:
    """A small Qwen2 (GQA, q/k biases) or DeepSeek-V3 (MLA, MoE with fused 3-D experts), fp32, seed 0."""
    from transformers import AutoModelForCausalLM, DeepseekV3Config, Qwen2Config

    rope = {"rope_type": "default", "rope_theta": 10000.0}
    if kind == "qwen2":
        config = Qwen2Config(
            vocab_size=VOCAB,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
            rope_parameters=rope,
            max_position_embeddings=64,
            tie_word_embeddings=False,
        )
    elif kind == "k2":
        config = DeepseekV3Config(
            vocab_size=VOCAB,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            q_lora_rank=32,
            kv_lora_rank=32,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            v_head_dim=16,
            intermediate_size=128,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
            n_shared_experts=1,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            rope_parameters=rope,
            max_position_embeddings=64,
            tie_word_embeddings=False,
        )
    else:
        raise ValueError(f"unknown model kind {kind!r}; known: {MODELS}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    return model.train()


def fixed_batch() -> torch.Tensor:
    """Token ids [BATCH, SEQ]; rank r trains on rows [r * BATCH/2, (r + 1) * BATCH/2)."""
    gen = torch.Generator().manual_seed(123)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)


def tau_between(per_head_max: dict[int, torch.Tensor]) -> float:
    """A tau halfway between the two middle recorded maxima: about half the heads get clipped."""
    values = sorted(torch.cat([v.reshape(-1) for v in per_head_max.values()]).tolist())
    mid = len(values) // 2
    return 0.5 * (values[mid - 1] + values[mid])


def reference_run(kind: str, micro_batches: int = 2) -> dict:
    """Single-process MuonClip (+ QK-Clip on the clip step) on the full batch.

    micro_batches=2: the gradient is the mean of the two halves' gradients (gradient
    accumulation), i.e. the same fp32 sums DeepSpeed's 2-rank average makes, so the result
    can be compared bit for bit. micro_batches=1: one forward over the whole batch, whose
    gradient differs from that mean by float rounding (~1e-7 relative). Results: params
    after STEPS steps ("A") and after the clip step ("B"), tau and the clipped heads.
    """
    from k2post.optim.muon import build_optimizer
    from k2post.optim.qk_clip import MaxLogitRecorder, apply_qk_clip

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the workers run single-threaded: same kernels, same sums
    model, chunks = build_small(kind), fixed_batch().chunk(micro_batches)
    optimizer, recorder, out = build_optimizer(model, optim_config()), MaxLogitRecorder().attach(model), {}
    try:
        for step in range(STEPS + 1):
            _accumulate_mean_grad(model, chunks)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if step == STEPS:
                per_head = recorder.per_head()
                out["tau"] = tau_between(per_head)
                out["clipped"] = apply_qk_clip(model, per_head, out["tau"]).clipped_heads
            recorder.reset()
            if step == STEPS - 1:
                out["A"] = _snapshot(model)
    finally:
        torch.set_num_threads(threads)
    out["B"] = _snapshot(model)
    return out


def _accumulate_mean_grad(model: nn.Module, chunks: tuple[torch.Tensor, ...]) -> None:
    """.grad = mean over `chunks` of each chunk's mean-loss gradient."""
    for ids in chunks:
        model(input_ids=ids, labels=ids).loss.backward()
    if len(chunks) > 1:
        for param in model.parameters():
            param.grad.div_(len(chunks))


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    """A detached copy of every (full) parameter."""
    return {name: param.detach().clone() for name, param in model.named_parameters()}


def _gathered_snapshot(engine, stage: int) -> dict[str, torch.Tensor]:
    """Full params of the engine's model copy (gathered at ZeRO-3)."""
    import deepspeed

    params = list(engine.module.parameters())
    ctx = deepspeed.zero.GatheredParameters(params) if stage == 3 else contextlib.nullcontext()
    with ctx:
        return _snapshot(engine.module)


def _master_snapshot(optimizer) -> dict[str, torch.Tensor]:
    """Full params rebuilt from every rank's fp32 master partitions (a collective)."""
    from k2post.optim.zero_layout import gather_full

    out = {}
    for bound in optimizer.flats:
        out.update(gather_full(bound, bound.flat))
    return out


class StepAudit:
    """Checks every ZeroMuonClip step against MuonClip on the same full params and gradient.

    Before a step (DeepSpeed calls `step` once per flat group at ZeRO-1/2), gather the group's
    full params and the full gradient DeepSpeed delivered into a shadow MuonClip; after it,
    step the shadow and record max |gathered new params - shadow params|. The shadow keeps its
    own momentum / Adam state, fed the same gradients. This isolates the optimizer from how the
    engine computed the gradient (ZeRO-3's forward/backward rounds differently, see the test).
    """

    def __init__(self, optimizer, cfg) -> None:
        self.optimizer, self.cfg = optimizer, cfg
        self.shadows: dict[int, tuple] = {}  # bound.index -> (MuonClip, {name: shadow param})
        self.pending: list = []
        self.max_diff, self.steps = 0.0, 0
        self.handles = [optimizer.register_step_pre_hook(self._pre), optimizer.register_step_post_hook(self._post)]

    def _shadow(self, bound, group: dict, params: dict[str, torch.Tensor]) -> tuple:
        from k2post.optim.muon import MuonClip

        if bound.index not in self.shadows:
            shadow = {name: nn.Parameter(torch.empty_like(p)) for name, p in params.items()}
            groups = [{"params": list(shadow.values()), "names": list(shadow), "use_muon": group["use_muon"]}]
            self.shadows[bound.index] = (MuonClip(groups, self.cfg), shadow)
        return self.shadows[bound.index]

    def _pre(self, optimizer, args, kwargs) -> None:
        from k2post.optim.zero_layout import gather_full

        self.pending = []
        for group in optimizer.param_groups:
            for flat in group["params"]:
                bound = optimizer.bound_flat(flat)
                if bound is None:
                    continue
                params, grads = gather_full(bound, flat), gather_full(bound, flat.grad)
                shadow_opt, shadow = self._shadow(bound, group, params)
                for name, param in shadow.items():
                    param.data.copy_(params[name])
                    param.grad = grads[name]
                self.pending.append((bound, flat, shadow_opt, shadow))

    def _post(self, optimizer, args, kwargs) -> None:
        from k2post.optim.zero_layout import gather_full

        for bound, flat, shadow_opt, shadow in self.pending:
            shadow_opt.step()
            after = gather_full(bound, flat)
            self.max_diff = max(self.max_diff, _max_diff(after, {n: p.detach() for n, p in shadow.items()}))
            self.steps += 1

    def remove(self) -> None:
        """Stop auditing (a checkpoint reload rewinds the real state but not the shadow's)."""
        for handle in self.handles:
            handle.remove()


def _train_step(engine, ids: torch.Tensor) -> float:
    """Forward + backward + step on this rank's half batch."""
    loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    engine.step()
    return float(loss.detach())


def ds_config(stage: int) -> dict:
    """fp32 ZeRO config; at stage 3 a low persistence threshold keeps small params (biases) gathered."""
    zero = {"stage": stage}
    if stage == 3:
        zero["stage3_param_persistence_threshold"] = 1000
    return {
        "train_micro_batch_size_per_gpu": BATCH // 2,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,
        "zero_optimization": zero,
        "steps_per_print": 10**9,
    }


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """max |a - b| over shared names."""
    return max(float((a[name] - b[name]).abs().max()) for name in a)


def run_case(kind: str, stage: int, out_dir: Path, rank: int) -> None:
    """A, B, C1, C2 (+ the per-step audit) for one model at one ZeRO stage; rank 0 saves the results."""
    from k2post.optim.deepspeed_muon import apply_qk_clip_zero, deepspeed_initialize, reduce_logits_and_plan
    from k2post.optim.qk_clip import MaxLogitRecorder

    t0 = time.time()
    ids = fixed_batch()[rank * BATCH // 2 : (rank + 1) * BATCH // 2]
    engine, optimizer = deepspeed_initialize(build_small(kind), optim_config(), ds_config(stage))
    recorder = MaxLogitRecorder().attach(engine.module)
    audit = StepAudit(optimizer, optim_config())
    result: dict = {"stage_seen": optimizer.zero_stage, "world": torch.distributed.get_world_size()}
    for _ in range(STEPS):
        _train_step(engine, ids)
        recorder.reset()
    result["A"] = _gathered_snapshot(engine, stage)
    _train_step(engine, ids)
    per_head, _ = reduce_logits_and_plan(engine.module, optimizer, recorder.per_head(), float("inf"))
    result["tau"] = tau_between(per_head)
    result["clipped"] = apply_qk_clip_zero(engine, recorder, result["tau"]).clipped_heads
    result["B"] = _gathered_snapshot(engine, stage)
    masters = _master_snapshot(optimizer) if optimizer.flats else result["B"]  # stage 0: the model is the master
    result["master_vs_model"] = _max_diff(masters, result["B"])
    audit.remove()
    result["audit_max_diff"], result["audit_steps"] = audit.max_diff, audit.steps
    _checkpoint_round_trip(engine, ids, out_dir / f"ckpt_{kind}_{stage}", stage, result)
    result["seconds"] = time.time() - t0
    if rank == 0:
        torch.save(result, out_dir / f"{kind}_zero{stage}.pt")
    recorder.detach()
    engine.destroy()


def _checkpoint_round_trip(engine, ids: torch.Tensor, ckpt: Path, stage: int, result: dict) -> None:
    """save -> step (C1) -> load -> step (C2): equal params mean optimizer state survived the checkpoint."""
    engine.save_checkpoint(str(ckpt), tag="t")
    _train_step(engine, ids)
    result["C1"] = _gathered_snapshot(engine, stage)
    engine.load_checkpoint(str(ckpt), tag="t")
    _train_step(engine, ids)
    result["C2"] = _gathered_snapshot(engine, stage)


def write_references(out: Path, kinds: list[str]) -> None:
    """The single-process runs, in a fresh process with one thread like the ranks: a pytest process
    may have had its thread pool rebound by an earlier in-process engine, which changes reductions."""
    refs = {
        kind: {"micro": reference_run(kind, 2), "full": reference_run(kind, 1), "init": _snapshot(build_small(kind))}
        for kind in kinds
    }
    out.mkdir(parents=True, exist_ok=True)
    torch.save(refs, out / "refs.pt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--stages", default="0,1,2,3")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument(
        "--reference", action="store_true", help="write the single-process references to OUT/refs.pt instead"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.reference:
        write_references(args.out, args.models.split(","))
        return
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        for kind in args.models.split(","):
            for stage in (int(s) for s in args.stages.split(",")):
                run_case(kind, stage, args.out, rank)
    finally:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    main()
