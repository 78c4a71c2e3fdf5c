"""k2post's vLLM worker extension: methods mixed into every vLLM worker (`LLM(worker_extension_cls=...)`).

`VLLMEngine` builds its `LLM` with `worker_extension_cls=WORKER_EXTENSION`, so these run inside each
worker through `llm.collective_rpc("k2post_...")` — in this process for the in-process engine, in
each worker process for a multiprocess executor:

- `k2post_load_weights(named, repack)` — in-place `model.load_weights` (+ CPU repack);
- `k2post_receive_update(address, ...)` — a checkpoint-engine `WeightReceiver` inside the worker:
  buckets arrive through the two IPC buffers and are loaded as they come (the caller resets the
  prefix cache when the update is done);
- `k2post_receive_adapter(address, lora_id, spec, ...)` — an adapter-only push: the LoRA tensors are received
  and registered as the worker's adapter (`k2post.rollout.lora_adapter`);
- `k2post_engine_dtypes()` / `k2post_held_verdicts(expected)` — what a verified push checks after loading: the
  engine's own parameters against the served tensors cast to their dtypes (`k2post.rollout.held_weights`);
- `k2post_in_place_problems(cpu)` — why in-place pushes would fail on the built model;
- `k2post_free_kv_cache()` / `k2post_restore_kv_cache()` — the CPU sleep path;
- `k2post_record_routing()` / `k2post_take_routing()` — record each token's MoE experts
  (`k2post.rollout.routing_capture`).
"""

from __future__ import annotations

from typing import Any

from k2post.rollout import sleep as sleep_ops
from k2post.rollout.weight_update import (
    NamedTensors,
    PushVerificationError,
    in_place_problems,
    load_into_model,
    tensor_digests,
    unwritten_parameters,
    worker_model,
)


def check_written(model: Any, loaded: set[str]) -> None:
    """PushVerificationError when a full push left model parameters unwritten (the engine skipped tensors)."""
    unwritten = unwritten_parameters(model, loaded)
    if unwritten:
        raise PushVerificationError(
            f"the push left {len(unwritten)} engine parameter(s) unwritten, e.g. {unwritten[:3]} "
            "(the engine skipped the tensors that hold them)"
        )


WORKER_EXTENSION = "k2post.rollout.worker_extension.K2PostWorkerExtension"


class K2PostWorkerExtension:
    """Mixed into vLLM's worker class; `self` is the worker."""

    def k2post_load_weights(self, named: NamedTensors, repack: bool) -> int:
        """Copy HF-named tensors into this worker's model in place. Returns the count."""
        return load_into_model(worker_model(self), named, repack)

    def k2post_receive_update(
        self,
        address: str,
        repack: bool,
        timeout_s: float = 60.0,
        verify_checksum: bool = True,
        verify_push: bool = False,
    ) -> dict[str, Any]:
        """Receive one checkpoint-engine update from `address` straight into this worker's model. With
        `verify_push`: every model parameter must have been written (else PushVerificationError naming them), the
        digests of the tensors as received come back (`digests`) for the trainer to compare, and what the engine
        must hold for each (`expected`: its casts to the engine's dtypes, for `k2post_held_verdicts`)."""
        from k2post_checkpoint_engine import WeightReceiver

        from k2post.rollout.held_weights import expected_held

        model = worker_model(self)
        loaded: set[str] = set()
        digests: dict[str, str] = {}
        expected: dict[str, dict] = {}
        dtypes = self.k2post_engine_dtypes() if verify_push else []

        def load(batch: NamedTensors) -> None:
            if verify_push:
                digests.update(tensor_digests(batch))
                expected.update(expected_held(batch, dtypes))  # before loading: the buffers are reused
            load_into_model(model, batch, repack, loaded)

        with WeightReceiver(address, load, timeout_s=timeout_s, verify_checksum=verify_checksum) as rx:
            stats = rx.run_update()
        if verify_push:
            check_written(model, loaded)
        figures = {"nbytes": stats.nbytes, "n_tensors": stats.n_tensors, "n_buckets": stats.n_buckets}
        checks = {"digests": digests, "expected": expected} if verify_push else {}
        return {**figures, "elapsed_s": stats.elapsed_s, **checks}

    def k2post_engine_dtypes(self) -> list[str]:
        """The dtypes of this worker's model parameters as loaded."""
        from k2post.rollout.held_weights import engine_dtypes
        from k2post.rollout.vllm_cpu_patch import loaded_parameters

        return engine_dtypes(loaded_parameters(worker_model(self)))

    def k2post_held_verdicts(self, expected: dict[str, dict]) -> dict[str, str]:
        """Served name -> equal / rounded / wrong: what this worker's model parameters hold now, against the served
        tensors cast to their dtypes (`k2post.rollout.held_weights`)."""
        from k2post.rollout.held_weights import held_verdicts
        from k2post.rollout.vllm_cpu_patch import loaded_parameters

        return held_verdicts(loaded_parameters(worker_model(self)), expected)

    def k2post_receive_adapter(
        self,
        address: str,
        lora_id: int,
        spec: dict[str, Any],
        timeout_s: float = 60.0,
        verify_checksum: bool = True,
        verify_push: bool = False,
    ) -> dict[str, Any]:
        """Receive a LoRA adapter's tensors from `address` and register them as adapter `lora_id` (replacing the
        previous one). Returns the receiver's figures, the module counts (`install_adapter`) and, with `verify_push`,
        the digests of the tensors as received."""
        from k2post_checkpoint_engine import WeightReceiver

        from k2post.rollout.lora_adapter import install_adapter

        tensors: dict[str, Any] = {}

        def load(batch: NamedTensors) -> None:
            tensors.update((name, tensor.detach().clone()) for name, tensor in batch)  # buffers are reused

        with WeightReceiver(address, load, timeout_s=timeout_s, verify_checksum=verify_checksum) as rx:
            stats = rx.run_update()
        checks = {"digests": tensor_digests(tensors.items())} if verify_push else {}  # vLLM scales B in place
        counts = install_adapter(self, lora_id, tensors, spec)  # every pushed module mapped, or an error naming one
        figures = {"nbytes": stats.nbytes, "n_tensors": stats.n_tensors, "n_buckets": stats.n_buckets}
        return {**figures, "elapsed_s": stats.elapsed_s, "lora_id": lora_id, **counts, **checks}

    def k2post_in_place_problems(self, cpu: bool) -> list[str]:
        """Why in-place pushes cannot work here (empty: they can)."""
        return in_place_problems(worker_model(self), cpu)

    def k2post_free_kv_cache(self) -> int:
        """CPU sleep: drop the KV-cache memory. Returns bytes freed."""
        return sleep_ops.free_kv_cache(self)

    def k2post_restore_kv_cache(self) -> int:
        """CPU wake-up: re-allocate the KV cache. Returns bytes re-allocated."""
        return sleep_ops.restore_kv_cache(self)

    def k2post_record_routing(self) -> tuple[list[int], int]:
        """Hook every MoE router of the model; returns (MoE layer ids, top_k) of what will be recorded."""
        from k2post.rollout.routing_capture import RoutingRecorder

        recorder = RoutingRecorder.install(self)
        return recorder.layer_ids, recorder.top_k

    def k2post_take_routing(self) -> dict[str, Any]:
        """Recorded experts per vLLM request id since the last take: (positions [n], experts [n, L, k])."""
        recorder = getattr(self, "k2post_routing", None)
        return recorder.take() if recorder is not None else {}
