"""MuonClip under the DeepSpeed engine (ZeRO stages 0-3): Distributed Muon + QK-Clip on fp32 masters.

Under ZeRO, DeepSpeed replaces every param group's params by this rank's flat fp32 partition
and calls the client optimizer's `step()` with `.grad` = the averaged flat gradient
partition. `ZeroMuonClip` is that client optimizer. After `bind(engine)` it knows where every
parameter's elements sit in the partitions (`k2post.optim.zero_layout`) and steps like this:

- AdamW groups: `adamw_step_` on the flat partition (AdamW is elementwise: exact).
- Muon groups (Distributed Muon, Moonlight-style): momentum on the local shard
  (`muon_direction`, elementwise), one all-gather per flat partition of the direction in the
  NS dtype (`ns_compute_dtype`: NS casts its input to it first, so gathering bf16 on GPU is exact
  and halves the traffic),
  rebuild each full matrix with a local piece (3-D expert stacks stay one tensor, NS per
  expert), orthogonalize it with MuonClip's own `orthogonalize_many` (same-shaped matrices
  batched), and apply
  W <- W (1 - lr wd) - lr * 0.2 sqrt(max(n, m)) * NS(D) to the local elements only.
  Every rank runs NS on bit-identical inputs, so a matrix split across two ranks is updated
  consistently, and the result equals single-process `MuonClip` on the same gradient (bit for
  bit in bf16 NS on AVX-512 CPUs; up to a few fp32 ulps of batched vs per-tensor GEMMs otherwise).
- Not bound / ZeRO stage 0: params are whole tensors and the step is `muon_step_` /
  `adamw_step_` per tensor (same numerics as `MuonClip`).

QK-Clip: `apply_qk_clip_zero(engine, recorder, tau)` all-reduces (MAX) the recorded per-head
max logits over the data-parallel group, plans the row scales with `plan_qk_clip`, and scales
those rows in the fp32 master partitions (the pieces this rank holds) and in the model copies.

Usage (see docs/DEEPSPEED.md):

    engine, optimizer = deepspeed_initialize(model, OptimConfig(), ds_config)
    loss = engine(**batch).loss; engine.backward(loss); engine.step()
    stats = apply_qk_clip_zero(engine, recorder, tau)   # if QK-Clip is on

Tests: `python -m pytest tests/k2post/optim/test_deepspeed_muon.py -q` (the slow ones launch 2
gloo ranks on CPU with DS_ACCELERATOR=cpu).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from k2post.optim.config import OptimConfig
from k2post.optim.muon import (
    MAX_BATCH_NUMEL,
    UpdateStats,
    adamw_step_,
    apply_update_,
    group_hparams,
    matrix_view,
    muon_direction,
    muon_step_,
    orthogonalize_many,
    run_closure,
    rms_factor,
)
from k2post.optim.newton_schulz import ns_compute_dtype
from k2post.optim.param_groups import ParamSpecError, build_param_groups, row_splits
from k2post.optim.qk_clip import (
    MaxLogitRecorder,
    QKClipStats,
    RowScale,
    apply_row_scales,
    compute_qk_clip_stats,
    plan_qk_clip,
    reduce_per_head_max,
)
from k2post.optim.zero_layout import (
    BoundFlat,
    ParamSlot,
    all_gather_parts,
    assemble_full,
    row_segments,
    zero3_flats,
    zero12_flats,
)

logger = logging.getLogger(__name__)

SUPPORTED_STAGES = (0, 1, 2, 3)
GatherFn = Callable[[Tensor, BoundFlat], list[Tensor]]


def default_gather(local: Tensor, bound: BoundFlat) -> list[Tensor]:
    """All-gather `local` [P] over the flat's data-parallel group (one tensor per rank)."""
    return all_gather_parts(local, bound.process_group, bound.layout.world_size)


def _shape_batches(
    slots: Iterable[tuple[ParamSlot, int]], max_numel: int = MAX_BATCH_NUMEL
) -> Iterator[list[tuple[ParamSlot, int]]]:
    """(slot, row splits) pairs grouped by matrix shape [n, m] (after splitting fused rows) into
    batches of at most `max_numel` elements."""
    buckets: dict[tuple[int, int], list[tuple[ParamSlot, int]]] = defaultdict(list)
    for slot, splits in slots:
        buckets[(slot.shape[-2] // splits, slot.shape[-1])].append((slot, splits))
    for bucket in buckets.values():
        batch, numel = [], 0
        for slot, splits in bucket:
            if batch and numel + slot.numel > max_numel:
                yield batch
                batch, numel = [], 0
            batch.append((slot, splits))
            numel += slot.numel
        yield batch


def _check_muon_group(group: dict[str, Any]) -> None:
    """A use_muon group may only hold matrices [n, m] or stacks of them [E, n, m]."""
    names = group.get("names") or [f"#{i}" for i in range(len(group["params"]))]
    for name, param in zip(names, group["params"]):
        if param.ndim not in (2, 3):
            raise ParamSpecError(
                f"param {name} has shape {tuple(param.shape)}: a Muon group takes 2-D matrices and 3-D "
                "stacks of them only; put it in a group with use_muon=False"
            )


class ZeroMuonClip(torch.optim.Optimizer):
    """MuonClip as a DeepSpeed client optimizer: exact Distributed Muon on ZeRO flat partitions.

    Build it from `build_param_groups(model, cfg)` (groups with "params", "names", "use_muon";
    optional per-group overrides of lr, weight_decay, ...), pass it to `deepspeed.initialize`,
    then call `bind(engine)` before the first step (`deepspeed_initialize` does all three).
    """

    def __init__(self, params: Iterable[dict], cfg: OptimConfig, gather: GatherFn = default_gather) -> None:
        self.cfg = cfg
        self.gather = gather
        self.update_stats = UpdateStats()  # Muon updates applied on this rank since the caller's last reset
        self._named_params: list[tuple[str, Tensor]] = []  # the model's params, before ZeRO swaps them out
        self._names_by_id: dict[int, str] = {}
        super().__init__(params, group_hparams(cfg))  # fills the two above through add_param_group
        self.zero_stage: int | None = None
        self.zero_optimizer: Any = None
        self.process_group: Any = None
        self._flats: dict[int, BoundFlat] = {}  # id(flat fp32 partition) -> binding
        self._slots: dict[str, tuple[BoundFlat, ParamSlot]] = {}  # param name -> (flat, slot)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group after checking it says which update it uses (and Muon params are matrices)."""
        if "use_muon" not in param_group:
            raise ValueError("every ZeroMuonClip param group needs 'use_muon': True (Muon) or False (AdamW)")
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        if group["use_muon"]:
            _check_muon_group(group)
        g = len(self.param_groups) - 1
        names = group.get("names") or [f"group{g}.param{k}" for k in range(len(group["params"]))]
        self._named_params += list(zip(names, group["params"]))
        self._names_by_id.update({id(param): name for name, param in zip(names, group["params"])})

    @property
    def flats(self) -> list[BoundFlat]:
        """The bound flat partitions (empty before `bind` and at stage 0)."""
        return list(self._flats.values())

    def bound_flat(self, tensor: Tensor) -> BoundFlat | None:
        """The binding of a flat partition DeepSpeed passes to `step` (None for anything else)."""
        return self._flats.get(id(tensor))

    def bind(self, engine_or_zero: Any) -> "ZeroMuonClip":
        """Learn the ZeRO layout of a DeepSpeed engine (or its ZeRO optimizer) built with this optimizer."""
        zero = _zero_optimizer_of(engine_or_zero)
        _reject_deepspeed_muon_tags(self._named_params)
        if zero is None:
            _check_plain_params(self)
            stage, flats = 0, []
        elif getattr(zero, "optimizer", None) is not self:
            raise ValueError(f"{type(zero).__name__} wraps {type(zero.optimizer).__name__}, not this ZeroMuonClip")
        elif hasattr(zero, "single_partition_of_fp32_groups"):
            stage, flats = (2 if zero.partition_gradients else 1), zero12_flats(zero, self._names_by_id)
        else:
            stage, flats = 3, zero3_flats(zero, self._names_by_id)
        group = getattr(engine_or_zero, "seq_data_parallel_group", None)
        return self.bind_flats(flats, stage, zero, group)

    def bind_flats(
        self, flats: list[BoundFlat], stage: int, zero_optimizer: Any = None, process_group: Any = None
    ) -> "ZeroMuonClip":
        """Bind to explicit flat partitions (what `bind` reads from DeepSpeed; tests build them by hand)."""
        self.zero_stage, self.zero_optimizer = stage, zero_optimizer
        self._flats = {id(bound.flat): bound for bound in flats}
        self._slots = {slot.name: (bound, slot) for bound in flats for slot in bound.layout.slots}
        self.process_group = process_group if process_group is not None or not flats else flats[0].process_group
        return self

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        """One step over the (DeepSpeed-selected) param groups; returns the closure's loss if given."""
        loss = run_closure(closure)
        for group in self.param_groups:
            for param in group["params"]:
                bound = self._flats.get(id(param))
                if bound is not None:
                    self._flat_step(param, bound, group)
                elif param.grad is not None:
                    self._full_step(param, group)
        return loss

    def _full_step(self, param: Tensor, group: dict[str, Any]) -> None:
        """MuonClip's per-tensor step on a whole parameter (not bound / ZeRO stage 0)."""
        if id(param) not in self._names_by_id:
            raise RuntimeError(
                f"ZeroMuonClip got a tensor of shape {tuple(param.shape)} it was not built with (a ZeRO flat "
                "partition?): call optimizer.bind(engine) right after deepspeed.initialize"
            )
        if not group["use_muon"]:
            adamw_step_(param, param.grad, self.state[param], group)
            return
        splits = row_splits(self._names_by_id[id(param)], tuple(param.shape), self.cfg)
        muon_step_(param, param.grad, self.state[param], group, splits, self.update_stats)

    def _flat_step(self, flat: Tensor, bound: BoundFlat, group: dict[str, Any]) -> None:
        """AdamW (elementwise) or Distributed Muon on one flat fp32 partition."""
        if flat.grad is None:
            raise RuntimeError(f"ZeRO flat partition {bound.index} has no gradient; DeepSpeed always sets one")
        if group["use_muon"]:
            self._muon_flat_step(flat, bound, group)
        else:
            adamw_step_(flat, flat.grad, self.state[flat], group)

    def _muon_flat_step(self, flat: Tensor, bound: BoundFlat, group: dict[str, Any]) -> None:
        """Local momentum -> all-gather directions in the NS dtype -> NS of full matrices -> update local pieces."""
        state = self.state[flat]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(flat)  # [P]
        direction = muon_direction(flat.grad, state["momentum_buffer"], group["momentum"], group["nesterov"])
        dtype = ns_compute_dtype(group.get("ns_dtype", "auto"), flat.device)
        parts = self.gather(direction.to(dtype), bound)  # R x [P], NS dtype
        rank, lr, wd = bound.layout.rank, float(group["lr"]), group["weight_decay"]
        slots = [(slot, row_splits(slot.name, tuple(slot.shape), self.cfg)) for slot in bound.layout.local_slots()]
        for batch in _shape_batches(slots, self.cfg.ns_batch_numel):
            fulls = [matrix_view(assemble_full(slot, parts), k) for slot, k in batch]  # [B, n, m] NS dtype each
            orthos = orthogonalize_many(fulls, group["ns_steps"], group["ns_eps"], dtype)
            for (slot, _), ortho, full in zip(batch, orthos, fulls):
                ortho_flat, scale = (
                    ortho.reshape(-1),
                    rms_factor(full.shape, group["rms_scale"]),
                )  # same order as the slot
                for piece in slot.local_pieces(rank):
                    local = flat.narrow(0, piece.part_offset, piece.numel)
                    update = ortho_flat.narrow(0, piece.param_offset, piece.numel)
                    apply_update_(local, update, lr, wd, scale)
                    self.update_stats.add(update, scale)

    @torch.no_grad()
    def scale_rows_(self, module: nn.Module, plan: list[RowScale]) -> None:
        """Apply QK-Clip row scales to the fp32 masters this rank holds and to the model copies.

        Every rank must call it with the same plan (it may run a collective).
        """
        if not plan:
            return
        if self.zero_stage in (None, 0):
            apply_row_scales(module, plan)
            return
        touched = self._scale_master_rows(plan)
        if self.zero_stage in (1, 2):
            _sync_zero12_model_copy(self, module, plan)
        else:
            _sync_zero3_model_copy(self, module, plan, touched)

    def _scale_master_rows(self, plan: list[RowScale]) -> list[tuple[BoundFlat, int, int]]:
        """Scale the planned rows inside this rank's master partitions; returns (flat, offset, numel) runs."""
        touched = []
        for entry in plan:
            if entry.param_name not in self._slots:
                raise KeyError(f"QK-Clip plan names {entry.param_name!r}, which this ZeroMuonClip does not hold")
            bound, slot = self._slots[entry.param_name]
            for part_offset, _, numel in row_segments(slot, entry.rows, bound.layout.rank):
                bound.flat.narrow(0, part_offset, numel).mul_(entry.factor)
                touched.append((bound, part_offset, numel))
        return touched


def _zero_optimizer_of(obj: Any) -> Any:
    """The ZeRO optimizer behind an engine / ZeRO optimizer, or None at stage 0."""
    if hasattr(obj, "single_partition_of_fp32_groups") or hasattr(obj, "fp32_partitioned_groups_flat"):
        return obj
    if hasattr(obj, "zero_optimization_stage"):  # a DeepSpeedEngine
        stage = int(obj.zero_optimization_stage())
        if stage not in SUPPORTED_STAGES:
            raise ValueError(f"ZeRO stage {stage} is not supported; supported: {SUPPORTED_STAGES}")
        return _zero_optimizer_of(obj.optimizer) if stage > 0 else None
    if isinstance(obj, ZeroMuonClip):
        return None
    raise ValueError(f"bind() needs a DeepSpeedEngine or its ZeRO optimizer, got {type(obj).__name__}")


def _reject_deepspeed_muon_tags(named_params: list[tuple[str, Tensor]]) -> None:
    """DeepSpeed runs its own Muon on params tagged `param.use_muon`; that would orthogonalize twice."""
    tagged = [name for name, param in named_params if getattr(param, "use_muon", False)]
    if tagged:
        raise ValueError(
            f"params {tagged[:3]} carry DeepSpeed's `use_muon` attribute, which makes ZeRO apply its own Muon to "
            "the gradients before our step; delete the attribute (ZeroMuonClip routes by param group instead)"
        )


def _check_plain_params(optimizer: ZeroMuonClip) -> None:
    """At stage 0 our groups must still hold the model's own tensors (no flattening wrapper)."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            if id(param) not in optimizer._names_by_id:
                raise ValueError(
                    "the engine flattened the params without ZeRO (e.g. bf16 at stage 0 uses BF16_Optimizer); "
                    "use ZeRO stage 1-3 with ZeroMuonClip"
                )


def _sync_zero12_model_copy(optimizer: ZeroMuonClip, module: nn.Module, plan: list[RowScale]) -> None:
    """ZeRO-1/2: every rank holds the full model copy; bring the planned rows in line with the masters."""
    zero = optimizer.zero_optimizer
    same_dtype = all(bound.lp_flat.dtype == bound.flat.dtype for bound in optimizer.flats)
    if same_dtype:
        apply_row_scales(module, plan)  # m * f in fp32 on every rank == the scaled master: exact, no traffic
    else:
        zero.update_lp_params()  # low-precision copy = cast of the masters, all-gathered (a collective)


def _sync_zero3_model_copy(
    optimizer: ZeroMuonClip, module: nn.Module, plan: list[RowScale], touched: list[tuple[BoundFlat, int, int]]
) -> None:
    """ZeRO-3: copy the scaled master runs into the model partitions; rescale full persistent copies."""
    for bound, offset, numel in touched:
        bound.lp_flat.narrow(0, offset, numel).copy_(bound.flat.narrow(0, offset, numel))
    params = dict(module.named_parameters())
    for entry in plan:
        param = params[entry.param_name]
        if param.data.numel() == getattr(param, "ds_numel", -1) and param.data.numel() > 0:
            param.data.view(param.ds_shape)[entry.rows].mul_(entry.factor)  # gathered (persistent) full copy


def reduce_logits_and_plan(
    module: nn.Module, optimizer: ZeroMuonClip, per_head_max: dict[int, Tensor], tau: float
) -> tuple[dict[int, Tensor], list[RowScale]]:
    """All-reduce (MAX) the per-head maxima over the DP group, then plan the clip (same on all ranks)."""
    per_head = reduce_per_head_max(per_head_max, group=optimizer.process_group)
    return per_head, plan_qk_clip(module, per_head, tau)


def apply_qk_clip_zero(
    engine: Any, recorder: MaxLogitRecorder, tau: float, optimizer: ZeroMuonClip | None = None
) -> QKClipStats:
    """QK-Clip after `engine.step()` under ZeRO: reduce maxima, scale masters + model copies, reset `recorder`.

    Call it on every rank after every step (it runs collectives). `optimizer` defaults to the
    ZeroMuonClip bound to `engine`.
    """
    optimizer = optimizer or find_zero_muon_clip(engine)
    per_head, plan = reduce_logits_and_plan(engine.module, optimizer, recorder.per_head(), tau)
    optimizer.scale_rows_(engine.module, plan)
    stats = compute_qk_clip_stats(per_head, tau)
    if stats.num_nonfinite:
        logger.warning("QK-Clip: %d heads have a non-finite max logit; they were not clipped", stats.num_nonfinite)
    recorder.reset()
    return stats


def find_zero_muon_clip(engine: Any) -> ZeroMuonClip:
    """The ZeroMuonClip inside `engine` (its client optimizer, possibly wrapped by ZeRO)."""
    candidate = getattr(engine, "optimizer", None)
    for _ in range(3):
        if isinstance(candidate, ZeroMuonClip):
            if candidate.zero_stage is None:
                raise RuntimeError("the engine's ZeroMuonClip is not bound: call optimizer.bind(engine) first")
            return candidate
        candidate = getattr(candidate, "optimizer", None)
    raise ValueError(f"no ZeroMuonClip inside {type(engine).__name__}; build the engine with deepspeed_initialize")


def client_optimizer_config(ds_config: dict[str, Any]) -> dict[str, Any]:
    """A copy of `ds_config` that accepts a client optimizer under ZeRO and has no optimizer of its own."""
    if "optimizer" in ds_config:
        raise ValueError("ds_config has an 'optimizer' section; ZeroMuonClip is passed as the client optimizer instead")
    config = dict(ds_config)
    config["zero_allow_untested_optimizer"] = True
    return config


def deepspeed_initialize(
    model: nn.Module, cfg: OptimConfig, ds_config: dict[str, Any], **kwargs: Any
) -> tuple[Any, ZeroMuonClip]:
    """`deepspeed.initialize` with a bound ZeroMuonClip over `model` (routed by `build_param_groups`)."""
    import deepspeed

    optimizer = ZeroMuonClip(build_param_groups(model, cfg), cfg)
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=optimizer, config=client_optimizer_config(ds_config), **kwargs
    )
    optimizer.bind(engine)
    return engine, optimizer
