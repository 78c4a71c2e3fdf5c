"""Check a model directory's weight files before anything loads them (no torch import).

A directory with `config.json` but no weights, a `model.safetensors` cut short by a crash or a failed copy,
or an index naming a missing shard would otherwise fail deep inside transformers or vLLM with a long
traceback. `check_weights` reads only each safetensors header (8-byte length + JSON) and compares the
largest tensor end offset with the file size:

    check_weights("runs/sft/final", "model.path")
    # FileNotFoundError: model.path 'runs/sft/final': no weights (model.safetensors, *.safetensors or ...)
    # ValueError: model.path 'runs/x/final': model.safetensors is truncated (1048576 of 4194432 bytes)
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

MAX_HEADER_BYTES = 100 << 20


def _safetensors_problem(path: Path) -> str | None:
    """Why a safetensors file cannot be loaded (truncated, bad header), or None."""
    size = path.stat().st_size
    if size < 8:
        return f"{path.name} is truncated ({size} bytes: not even a header)"
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        if length > MAX_HEADER_BYTES or 8 + length > size:
            return f"{path.name} is truncated or not safetensors (header of {length} bytes, file of {size})"
        try:
            header = json.loads(handle.read(length))
        except (ValueError, RecursionError):
            return f"{path.name} has an unreadable header (not safetensors, or damaged)"
    if not isinstance(header, dict):
        return f"{path.name} has an unreadable header (not safetensors, or damaged)"
    ends = [entry.get("data_offsets", [0, 0])[1] for key, entry in header.items() if key != "__metadata__"]
    needed = 8 + length + max((end for end in ends if isinstance(end, int)), default=0)
    return f"{path.name} is truncated ({size} of {needed} bytes)" if size < needed else None


def _indexed_shards(model_dir: Path) -> list[Path] | None:
    """The shards a `model.safetensors.index.json` names, or None without an index."""
    index = model_dir / "model.safetensors.index.json"
    if not index.is_file():
        return None
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
    except (ValueError, AttributeError, RecursionError):
        raise ValueError(f"{index}: unreadable index (not JSON with a weight_map)") from None
    return [model_dir / name for name in sorted(set(weight_map.values()))]


def check_weights(model_dir: str | Path, what: str) -> None:
    """FileNotFoundError / ValueError, one line naming `what` and the file, when the directory's weights
    cannot be loaded; nothing when they look whole."""
    root = Path(model_dir)
    shards = _indexed_shards(root)
    files = shards if shards is not None else sorted(root.glob("*.safetensors"))
    if shards is not None:
        missing = [p.name for p in shards if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"{what} {str(root)!r}: the index names missing shard(s) {missing}")
    if not files:
        if sorted(root.glob("pytorch_model*.bin")):
            return
        raise FileNotFoundError(
            f"{what} {str(root)!r}: no weights (model.safetensors, *.safetensors or pytorch_model*.bin)"
        )
    for path in files:
        problem = _safetensors_problem(path)
        if problem:
            raise ValueError(f"{what} {str(root)!r}: {problem}")
