"""Record, inside the vLLM worker, which experts each token was routed to (MoE models; RL routing replay).

vLLM's MoE routers call a capture callback with the top-k expert ids of every token of a forward step
(`BaseRouter.set_capture_fn`, the hook vLLM's own routed-experts capture uses). `RoutingRecorder` installs
one on every router and files each step's rows under the request and position they belong to (the model
runner's batch layout at that step); `VLLMEngine.generate` takes them after each call and hands every
`Generation` an int16 array [prompt + response tokens, moe_layers, top_k] (-1 where a position was never
an input: the last sampled token). Prefix caching is off while recording, so every token is computed.

    recorder = RoutingRecorder.install(worker)     # the worker extension's k2post_record_routing()
    records = recorder.take()                      # {vllm request id: (positions [n], experts [n, L, k])}
    experts = assemble(records[request_id], total_len, layers, top_k)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class RoutingCaptureError(RuntimeError):
    """The engine's model has no MoE router to record, or a request id could not be matched."""


def moe_runners(model: Any) -> list[Any]:
    """vLLM's MoE runner modules of `model` that expose a router with a capture hook, by layer id."""
    from vllm.model_executor.layers.fused_moe.layer import MoERunner

    runners = [m for m in model.modules() if isinstance(m, MoERunner) and hasattr(m.router, "set_capture_fn")]
    return sorted(runners, key=lambda m: m.layer_id)


class RoutingRecorder:
    """Collects each forward step's top-k expert ids per request and position (one per worker)."""

    def __init__(self, runner: Any, layer_ids: list[int], top_k: int) -> None:
        self.runner, self.layer_ids, self.top_k = runner, layer_ids, top_k
        self.slot = {layer: index for index, layer in enumerate(layer_ids)}
        self.step: torch.Tensor | None = None  # [n, L, k] of the forward in progress
        self.layout: tuple[list[str], list[int], torch.Tensor] | None = None
        self.records: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}

    @classmethod
    def install(cls, worker: Any) -> "RoutingRecorder":
        runner = worker.model_runner
        runners = moe_runners(runner.model)
        if not runners:
            raise RoutingCaptureError(
                "record_routing: the engine's model has no MoE router to record (a dense model?): "
                "turn rollout.engine.record_routing / routing_replay off"
            )
        top_k = int(runners[0].router.top_k)
        recorder = cls(runner, [int(m.layer_id) for m in runners], top_k)
        for module in runners:
            module.router.set_capture_fn(lambda ids, layer=int(module.layer_id): recorder.capture(layer, ids))
        worker.k2post_routing = recorder
        return recorder

    def _begin(self) -> None:
        """Snapshot the runner's batch layout (request order, query offsets, positions) for this step."""
        req_ids = list(self.runner.input_batch.req_ids)
        offsets = self.runner.query_start_loc.cpu[: len(req_ids) + 1].tolist()
        positions = self.runner.positions[: offsets[-1]].detach().cpu().clone()
        self.layout = (req_ids, offsets, positions)
        self.step = torch.full((offsets[-1], len(self.layer_ids), self.top_k), -1, dtype=torch.int16)

    def capture(self, layer_id: int, topk_ids: torch.Tensor) -> None:
        """vLLM's callback: `topk_ids` [tokens (maybe padded), k] of MoE layer `layer_id` in this step."""
        if layer_id == self.layer_ids[0]:
            self._begin()
        if self.step is None:
            return
        n = self.step.shape[0]
        self.step[:, self.slot[layer_id]] = topk_ids[:n].to(device="cpu", dtype=torch.int16)
        if layer_id == self.layer_ids[-1]:
            self._commit()

    def _commit(self) -> None:
        req_ids, offsets, positions = self.layout
        for index, req_id in enumerate(req_ids):
            start, end = offsets[index], offsets[index + 1]
            if end > start:
                chunk = (positions[start:end].numpy().astype(np.int64), self.step[start:end].numpy().copy())
                self.records.setdefault(req_id, []).append(chunk)
        self.step = self.layout = None

    def take(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Everything recorded since the last take, per request: (positions [n], experts int16 [n, L, k])."""
        out = {
            req_id: (np.concatenate([p for p, _ in chunks]), np.concatenate([e for _, e in chunks]))
            for req_id, chunks in self.records.items()
        }
        self.records = {}
        return out


def request_key(internal_id: str) -> tuple[str, int]:
    """(the LLM's request id, completion index) of a vLLM engine-core request id: `<id>-<suffix>` for n = 1,
    `<index>_<id>-<suffix>` for the children of an n > 1 request."""
    base = internal_id.rsplit("-", 1)[0] if "-" in internal_id else internal_id
    index, sep, parent = base.partition("_")
    if sep and index.isdigit():
        return parent, int(index)
    return base, 0


def assemble(record: tuple[np.ndarray, np.ndarray] | None, length: int, layers: int, top_k: int) -> np.ndarray:
    """int16 [length, layers, top_k]: each position's first recorded experts (a position computed twice keeps
    the first), -1 where none was recorded."""
    out = np.full((length, layers, top_k), -1, dtype=np.int16)
    if record is None:
        return out
    positions, experts = record
    for position, row in zip(positions[::-1], experts[::-1]):  # reversed: the first write wins
        if 0 <= position < length:
            out[position] = row
    return out


def merge_first(existing: np.ndarray | None, new: np.ndarray) -> np.ndarray:
    """An episode's routing after one more generation: positions already recorded keep theirs, new and
    unrecorded ones take `new`'s. [T0, L, k] (or None), [T1 >= T0, L, k] -> [T1, L, k]."""
    if existing is None:
        return new
    out = new.copy()
    known = (existing >= 0).all(axis=(1, 2))
    out[: existing.shape[0]][known] = existing[known]
    return out
