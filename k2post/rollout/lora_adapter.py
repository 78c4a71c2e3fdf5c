"""Adapter-only weight pushes: a LoRA adapter streamed into a live vLLM engine built with LoRA support.

With `lora.push: adapter` the RL trainer sends only the adapter tensors (A and B of every target, peft's
checkpoint names) through the checkpoint engine, megabytes instead of the model. Inside the vLLM worker
(`K2PostWorkerExtension.k2post_receive_adapter`) they become a `LoRAModel` in the worker's adapter manager, replacing
the previous one; `VLLMEngine` then tags every generation with that adapter's `LoRARequest`, so vLLM's LoRA kernels
compute x W^T + (alpha / r) (x A^T) B^T instead of a merged weight. No disk: the adapter is registered from the
received tensors, and the request's path is never read (the id is already loaded).

    spec = adapter_spec(rank=16, alpha=32.0, target_modules=["q_proj", "v_proj"])
    engine.receive_update(address, adapter=spec)            # VLLMEngine (built with lora_max_rank >= 16)
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

from k2post.rollout.weight_update import PushVerificationError, WeightUpdateError

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts
LORA_NAME = "k2post-rl"
IN_MEMORY_PATH = "k2post:in-memory"  # never read: the adapter is registered before any request names it


def adapter_spec(rank: int, alpha: float, target_modules: list[str]) -> dict[str, Any]:
    """What the engine needs besides the tensors to build the adapter (plain data: it crosses Ray and RPCs)."""
    return {"rank": int(rank), "alpha": float(alpha), "target_modules": list(target_modules)}


def vllm_max_lora_rank(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts that holds adapters of `rank`."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"LoRA rank {rank} exceeds vLLM's largest max_lora_rank {VLLM_LORA_RANKS[-1]}")


def cpu_lora_problem(model_dir: str) -> str | None:
    """Why vLLM's CPU build cannot serve LoRA adapters for this model (None: it can). A MoE model's LoRA layers
    run Triton kernels, which the CPU build lacks: tiny-k2 took an MLA adapter (every module mapped) and then
    failed its first generation ("triton.language has no attribute float32")."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    if config.get("n_routed_experts") or config.get("num_experts") or config.get("num_local_experts"):
        return (
            f"lora.push: adapter is not supported for the MoE model {config.get('architectures', ['?'])[0]} on the "
            "CPU vLLM build (its LoRA kernels for MoE layers need Triton): use lora.push: merged"
        )
    return None


def _adapter_manager(worker: Any) -> Any:
    runner = getattr(worker, "model_runner", None)
    manager = getattr(runner, "lora_manager", None)
    if manager is None:
        raise WeightUpdateError(
            "adapter push into an engine built without LoRA support: build it with rollout.engine.lora_max_rank "
            "(RL sets it when lora.push is adapter)"
        )
    return manager


def adapter_modules(tensor_names: list[str]) -> list[str]:
    """The modules an adapter's tensors adapt (peft names `base_model.model.X.lora_A.weight` -> `X`), sorted."""
    out = set()
    for name in tensor_names:
        module = re.sub(r"\.lora_(A|B)(\.[^.]+)?\.weight$", "", name)
        out.add(module.removeprefix("base_model.model."))
    return sorted(out)


def unmapped_modules(pushed: list[str], engine: set[str], packed: dict[str, list[str]]) -> list[str]:
    """The pushed adapter modules no LoRA module of the engine holds: neither under their own name nor inside the
    packed module vLLM stacks them into (`packed`: e.g. qkv_proj -> [q_proj, k_proj, v_proj])."""
    into = {piece: fused for fused, pieces in packed.items() for piece in pieces}
    out = []
    for module in pushed:
        parent, _, leaf = module.rpartition(".")
        if module not in engine and f"{parent}.{into.get(leaf, leaf)}" not in engine:
            out.append(module)
    return out


def check_mapped(pushed: list[str], engine: set[str], packed: dict[str, list[str]]) -> dict[str, int]:
    """{lora_pushed, lora_mapped}, or PushVerificationError naming the first pushed module the engine lacks."""
    unmapped = unmapped_modules(pushed, engine, packed)
    if unmapped:
        raise PushVerificationError(
            f"adapter push: module {unmapped[0]!r} maps to no LoRA module of the engine (pushed {len(pushed)}, "
            f"mapped {len(pushed) - len(unmapped)}): that part of the adapter would be lost; check "
            "lora.target_modules against the engine's model"
        )
    return {"lora_pushed": len(pushed), "lora_mapped": len(pushed)}


def install_adapter(
    worker: Any, lora_id: int, tensors: dict[str, torch.Tensor], spec: dict[str, Any]
) -> dict[str, int]:
    """Register the adapter `tensors` as LoRA `lora_id` in the worker's adapter manager, dropping the previous ones.
    Every pushed module must map to one of the engine's LoRA modules (`check_mapped`, before anything is replaced).
    Returns the counts: `lora_pushed` / `lora_mapped` modules, and `lora_modules`, how many LoRA modules of the
    engine the adapter covers (vLLM's names, q/k/v packed as qkv_proj)."""
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    worker_manager = _adapter_manager(worker)
    manager = worker_manager._adapter_manager
    helper = PEFTHelper.from_dict(
        {"r": spec["rank"], "lora_alpha": spec["alpha"], "target_modules": spec["target_modules"]}
    )
    helper.validate_legal(worker_manager.lora_config)
    mapper = getattr(manager.model, "hf_to_vllm_mapper", None)
    lora = LoRAModel.from_lora_tensors(
        lora_id,
        tensors,
        helper,
        device="cpu",
        dtype=worker_manager.lora_config.lora_dtype,
        weights_mapper=mapper.get_rename_mapper() if mapper is not None else None,
    )
    if not lora.loras:
        raise WeightUpdateError(f"the pushed adapter ({len(tensors)} tensors) matches no LoRA module of the engine")
    counts = check_mapped(adapter_modules(list(tensors)), set(manager.modules), dict(manager.packed_modules_mapping))
    for old in list(manager.list_adapters()):
        manager.remove_adapter(old)
    manager.add_adapter(lora)
    return {**counts, "lora_modules": len(lora.loras)}


def lora_request(lora_id: int) -> Any:
    """The request tag that makes vLLM apply adapter `lora_id`."""
    from vllm.lora.request import LoRARequest

    return LoRARequest(LORA_NAME, lora_id, lora_path=IN_MEMORY_PATH)
