"""LoRA adapters for the RL trainer (peft), the merged weights the engines get, and the proof that they arrived.

    model = apply_lora(load_causal_lm(path), cfg.lora)        # peft PeftModel; the base weights frozen
    optim = lora_optim(cfg.optim)                              # the adapters go to AdamW
    named = merged_named_tensors(model)                        # HF names, W + (alpha / r) B A for every target
    check_adapter_arrived(base_digests(model), engine_digests) # after a verified push

Which optimizer updates the adapters: **AdamW**, not Muon. Muon orthogonalizes the update of a full weight matrix
(every singular direction of dW moves by the same amount, scaled to the matrix's shape); that is the recipe K2 and
Moonlight use for the hidden matrices. On LoRA factors it would orthogonalize the updates of A [r, in] and B
[out, r] separately: each factor's r directions are forced to equal size, the product's update dW = B dA + dB A is
not orthogonal, and its size follows the factors' shapes (sqrt(max(r, in)), sqrt(max(out, r))) rather than W's.
So the adapters join the AdamW group, the group the recipe uses for parameters Muon is not defined for (embeddings,
norms); `optim.lr` is the adapters' lr.

The engines serve the base model: a push sends the merged weights W + (alpha / r) B A under the base model's HF
names (`merged_named_tensors`), so the engine needs no LoRA support. Every verified push checks that the engine
holds the trainer's merged tensors (digests) and, for every target whose adapter is nonzero, that it does not hold
the frozen base weight instead (`check_adapter_arrived`): a push that lost the adapter fails loudly.
"""

from __future__ import annotations

from typing import Any

import torch

from k2post.rollout.weight_update import (
    NamedTensors,
    PushVerificationError,
    checkpoint_cuts,
    tensor_digests,
    unique_state_entries,
)
from k2post.train.lora_config import LoRAConfig

ADAPTER = "default"  # peft's adapter name
ADAPTER_PATTERNS = ["lora_A", "lora_B"]  # parameter-name substrings of the adapters (routed to AdamW)


class LoRAError(ValueError):
    """The LoRA config does not fit the model (no target module matched)."""


def apply_lora(model: torch.nn.Module, cfg: LoRAConfig) -> Any:
    """Wrap `model` in a peft LoRA model: adapters on `cfg.target_modules`, no dropout (RL's log-ratio would see
    its noise), B initialized to zero (the wrapped model starts as the base model)."""
    from peft import LoraConfig, get_peft_model

    peft_cfg = LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=0.0, target_modules=cfg.target_modules)
    try:
        return get_peft_model(model, peft_cfg)
    except ValueError as err:
        names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise LoRAError(
            f"lora.target_modules {cfg.target_modules} match no linear module of {type(model).__name__} "
            f"(its linear modules end in {names}): {str(err).splitlines()[0][:200]}"
        ) from None


def lora_optim(optim: Any) -> Any:
    """`optim` with the adapters routed to AdamW (`adamw_patterns` + lora_A / lora_B)."""
    patterns = list(optim.adamw_patterns) + [p for p in ADAPTER_PATTERNS if p not in optim.adamw_patterns]
    return optim.model_copy(update={"adamw_patterns": patterns})


def lora_layers(model: Any) -> dict[str, Any]:
    """{HF module name: peft LoRA layer} of every adapted module."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    return {name: module for name, module in base.named_modules() if isinstance(module, LoraLayer)}


def hf_name(peft_state_name: str) -> str:
    """The base model's name of a state-dict entry of the wrapped base model (`x.base_layer.weight` -> `x.weight`)."""
    return peft_state_name.replace(".base_layer.", ".")


@torch.no_grad()
def merged_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """The base model's state dict (its own names) with every adapter merged in: new tensors for the targets,
    the frozen tensors themselves for the rest; the adapters are left out, and a tensor under two names (tied
    embeddings) appears once, under its first name (as `save_pretrained` writes it and vLLM loads it)."""
    layers = lora_layers(model)
    out: dict[str, torch.Tensor] = {}
    for name, value in unique_state_entries(model.get_base_model()):
        if ".lora_" in name:
            continue
        base, tensor = hf_name(name), value.data
        module = base.rsplit(".", 1)[0]
        if module in layers and base.endswith(".weight"):
            tensor = tensor + layers[module].get_delta_weight(ADAPTER).to(tensor.dtype)
        out[base] = tensor
    return out


def merged_named_tensors(model: Any) -> NamedTensors:
    """`merged_state_dict` under the HF checkpoint names the engines load (`checkpoint_cuts`)."""
    return [
        (served, cut(tensor))
        for name, tensor in merged_state_dict(model).items()
        for served, cut in checkpoint_cuts(name, tuple(tensor.shape))
    ]


def save_merged(model: Any, tokenizer: Any, out: Any, is_main: bool) -> None:
    """Rank 0 writes the merged model as a plain HF model dir (what `k2post eval` and the engines load) and the
    adapter alone under `out/adapter` (peft's adapter_config.json + adapter_model.safetensors)."""
    if not is_main:
        return
    model.get_base_model().save_pretrained(out, state_dict=merged_state_dict(model), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    model.save_pretrained(str(out / "adapter"), safe_serialization=True)


@torch.no_grad()
def base_digests(model: Any) -> dict[str, str]:
    """{HF name: digest of the frozen base weight} of every target whose adapter is nonzero now (before the first
    step B = 0 and the merged weight is the base weight: nothing to tell apart)."""
    out = []
    for name, layer in lora_layers(model).items():
        if float(layer.get_delta_weight(ADAPTER).abs().max()) > 0:
            out.append((f"{name}.weight", layer.get_base_layer().weight.data))
    return tensor_digests(out)


def check_adapter_arrived(base: dict[str, str], engine: dict[str, str]) -> None:
    """PushVerificationError naming the first adapted weight the engine holds without its adapter."""
    lost = [name for name, digest in base.items() if engine.get(name) == digest]
    if lost:
        raise PushVerificationError(
            f"tensor {lost[0]!r}: the engine holds the frozen base weight, not base + LoRA adapter "
            f"({len(lost)} of {len(base)} adapted weights): the adapter never arrived"
        )


def adapter_state(model: Any) -> dict[str, torch.Tensor]:
    """The adapter tensors by peft's checkpoint names (what `save_pretrained` of the peft model writes)."""
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(model)


def parameter_counts(model: torch.nn.Module) -> dict[str, int]:
    """Trainable (adapter) and total parameters."""
    params = list(model.parameters())
    return {"trainable": sum(p.numel() for p in params if p.requires_grad), "total": sum(p.numel() for p in params)}
