"""`k2post model export MODEL_DIR --int4 OUT`: an INT4 checkpoint in compressed-tensors "pack-quantized" format.

What K2 Thinking ships: the QAT targets (default the routed MoE experts) as INT4 — per expert linear
`<name>.weight_packed` (int32, 8 values per word along the input dim, `k2post.quant.int4.pack_int4`),
`<name>.weight_scale` ([out, in / group_size], the model's dtype) and `<name>.weight_shape` (int32 [out, in]) —
everything else as it was, and a `quantization_config` in config.json (quant_method compressed-tensors, format
pack-quantized, one config group: 4-bit symmetric int weights, group strategy, `ignore` = every other Linear).
Unpacking gives back exactly the fake-quant weights the QAT forward used (`dense_from_int4`; tested).

    report = export_int4("runs/rl/final", "out/int4", QATConfig(enabled=True))
    dense = dense_from_int4("out/int4")       # {checkpoint name: weight}, experts dequantized
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from k2post.models.outdir import check_out_dir, staged_dir
from k2post.models.weights import check_model_source
from k2post.quant.int4 import dequantize_int4, pack_int4, quantize_int4, unpack_int4
from k2post.quant.qat import QATConfig, qat_targets

WEIGHTS = "model.safetensors"


@dataclass
class ExportReport:
    """What an export wrote: quantized linears, their bytes before and after, the output dir."""

    out: Path
    quantized: int
    dense_bytes: int  # the quantized linears' weights as they were
    int4_bytes: int  # their packed words + scales + shapes

    def summary(self) -> str:
        ratio = self.int4_bytes / max(self.dense_bytes, 1)
        return (
            f"exported INT4 -> {self.out}\n  {self.quantized} linears quantized: {self.dense_bytes / 2**20:.2f} MiB -> "
            f"{self.int4_bytes / 2**20:.2f} MiB ({ratio:.3f}x)"
        )


def _quantized_names(model: torch.nn.Module, cfg: QATConfig) -> set[str]:
    """Checkpoint names of the target weights (fused experts named per expert, as the checkpoint has them)."""
    from k2post.rollout.weight_update import checkpoint_named_tensors

    prefixes = tuple(f"{module}." for module in qat_targets(model, cfg))
    return {name for name, tensor in checkpoint_named_tensors(model) if name.startswith(prefixes) and tensor.dim() == 2}


def quantization_config(group_size: int, ignore: list[str]) -> dict:
    """The config.json `quantization_config` of a pack-quantized W4A16 group-quantized checkpoint."""
    weights = {
        "num_bits": 4,
        "type": "int",
        "symmetric": True,
        "strategy": "group",
        "group_size": group_size,
        "dynamic": False,
        "actorder": None,
        "observer": "minmax",
    }
    group = {"targets": ["Linear"], "weights": weights, "input_activations": None, "output_activations": None}
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": {**group, "format": "pack-quantized"}},
        "ignore": ignore,
        "kv_cache_scheme": None,
    }


def _linear_names(model: torch.nn.Module) -> list[str]:
    return [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]


def export_int4(source: str | Path, out: str | Path, cfg: QATConfig, overwrite: bool = False) -> ExportReport:
    """Write `source` (an HF model dir) to `out` with the QAT targets in INT4 pack-quantized format."""
    from safetensors.torch import save_file

    from k2post.rollout.weight_update import checkpoint_named_tensors

    source, out = Path(source), Path(out)
    check_model_source(source, "MODEL_DIR")
    check_out_dir(source, out, overwrite, "--int4")
    model = load_source(source)
    quantized = _quantized_names(model, cfg)
    tensors, dense_bytes, int4_bytes = {}, 0, 0
    for name, tensor in checkpoint_named_tensors(model):
        if name not in quantized:
            tensors[name] = tensor.contiguous().clone()
            continue
        q, scale = quantize_int4(tensor, cfg.group_size)
        base = name.removesuffix(".weight")
        packed = {
            f"{base}.weight_packed": pack_int4(q),
            f"{base}.weight_scale": scale.to(tensor.dtype),
            f"{base}.weight_shape": torch.tensor(list(tensor.shape), dtype=torch.int32),
        }
        tensors.update(packed)
        dense_bytes += tensor.numel() * tensor.element_size()
        int4_bytes += sum(t.numel() * t.element_size() for t in packed.values())
    ignore = [n for n in _linear_names(model) if f"{n}.weight" not in quantized]
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = quantization_config(cfg.group_size, ignore)
    with staged_dir(out) as tmp:  # the old OUT is replaced only once the new one is complete
        _copy_other_files(source, tmp)
        save_file(tensors, str(tmp / WEIGHTS), metadata={"format": "pt"})
        (tmp / WEIGHTS).chmod(0o644)  # safetensors writes 0600; the other files keep the source's modes
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return ExportReport(out, len(quantized), dense_bytes, int4_bytes)


def load_source(source: Path) -> torch.nn.Module:
    """The model of `source` in float32 (what the quantizer reads); ValueError (one line) when it does not fit in
    memory or transformers cannot build it from its files (weights of other shapes than its config says)."""
    from k2post.models.load_errors import load_user_model
    from k2post.models.loading import load_causal_lm
    from k2post.models.weights import check_fits_in_memory

    check_fits_in_memory(source, "MODEL_DIR", bytes_per_weight=4)
    return load_user_model(source, "MODEL_DIR", lambda: load_causal_lm(source))


def _copy_other_files(source: Path, out: Path) -> None:
    """The source's non-weight files (tokenizer, generation config) into `out`; weights and config come after."""
    for path in source.iterdir():
        if path.is_file() and path.suffix != ".safetensors" and path.name not in ("config.json",):
            if not path.name.endswith(".safetensors.index.json"):
                shutil.copy2(path, out / path.name)


def dense_from_int4(export_dir: str | Path) -> dict[str, torch.Tensor]:
    """The export's tensors with every packed linear dequantized: {checkpoint name: weight} (the model's dtype)."""
    from safetensors.torch import load_file

    export_dir = Path(export_dir)
    group_size = json.loads((export_dir / "config.json").read_text())["quantization_config"]["config_groups"][
        "group_0"
    ]["weights"]["group_size"]
    tensors = load_file(str(export_dir / WEIGHTS))
    out = {}
    for name, tensor in tensors.items():
        if name.endswith((".weight_scale", ".weight_shape")):
            continue
        if not name.endswith(".weight_packed"):
            out[name] = tensor
            continue
        base = name.removesuffix(".weight_packed")
        scale, shape = tensors[f"{base}.weight_scale"], tensors[f"{base}.weight_shape"].tolist()
        q = unpack_int4(tensor, shape[-1])
        out[f"{base}.weight"] = dequantize_int4(q, scale, group_size, scale.dtype)
    return out
