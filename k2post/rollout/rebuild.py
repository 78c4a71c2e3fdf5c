"""Rebuild fallback for weight pushes: a model directory in shared memory, rewritten per update.

Used when the built engine cannot take weights in place (`VLLMEngineConfig.weight_update` is
`rebuild`, or `auto` found a model whose CPU kernels absorbed or repacked weights k2post cannot
refresh, e.g. DeepSeek-V3 MLA kernels in bf16). Pushed tensors are staged into a full copy of the
weights (the source checkpoint plus every earlier push); when the update ends, the state is written
as one safetensors file into a fresh directory under `shm_dir` (RAM-backed: no disk), next to
links to the source directory's config and tokenizer files, and the engine is rebuilt from it.

    ckpt = ShmCheckpoint(model_dir, "/dev/shm")
    ckpt.stage([(name, tensor), ...])      # copies; unknown names / shape mismatches raise
    new_dir = ckpt.write()                 # atomic: written under a temp name, then renamed
    ckpt.close()                           # removes every directory it wrote (also at exit)
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from k2post.rollout.weight_update import NamedTensors, WeightUpdateError


def load_checkpoint_state(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the (possibly sharded) safetensors checkpoint in `model_dir`."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise WeightUpdateError(f"{model_dir}: no *.safetensors files to stage pushes onto")
    state: dict[str, torch.Tensor] = {}
    for path in files:
        state.update(load_file(str(path)))
    return state


def _link_side_files(source: Path, target: Path) -> None:
    """Symlink everything but the weights (config, tokenizer, generation config) into `target`."""
    for path in source.iterdir():
        if path.suffix == ".safetensors" or path.name.endswith(".safetensors.index.json"):
            continue
        (target / path.name).symlink_to(path.resolve())


class ShmCheckpoint:
    """Full weight state plus versioned model directories written under `shm_root`."""

    def __init__(self, source_dir: str | Path, shm_root: str | Path):
        self.source_dir = Path(source_dir)
        Path(shm_root).mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix=f"k2post-rebuild-{os.getpid()}-", dir=shm_root))
        self._finalizer = weakref.finalize(self, shutil.rmtree, str(self.root), True)
        self.state = load_checkpoint_state(self.source_dir)
        self.version = 0
        self.current: Path | None = None

    def stage(self, named: NamedTensors) -> int:
        """Copy pushed tensors into the state (cast to the checkpoint dtype). Returns the count."""
        for name, tensor in named:
            held = self.state.get(name)
            if held is None:
                raise WeightUpdateError(f"pushed tensor {name!r} is not in the checkpoint {self.source_dir}")
            if tuple(held.shape) != tuple(tensor.shape):
                raise WeightUpdateError(
                    f"pushed tensor {name!r} has shape {tuple(tensor.shape)}, checkpoint {tuple(held.shape)}"
                )
            held.copy_(tensor.to(held.dtype))
        return len(named)

    def write(self) -> Path:
        """Write the state as a new model directory; drops the previous one. Returns its path."""
        self.version += 1
        target = self.root / f"v{self.version}"
        tmp = self.root / f".v{self.version}.tmp"
        tmp.mkdir()
        save_file(self.state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        _link_side_files(self.source_dir, tmp)
        tmp.rename(target)
        previous, self.current = self.current, target
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)
        return target

    def nbytes(self) -> int:
        """Bytes of the staged state (what each rebuild writes to shared memory)."""
        return sum(t.numel() * t.element_size() for t in self.state.values())

    def close(self) -> None:
        """Remove every directory this checkpoint wrote."""
        self._finalizer()
