"""Check a model directory's weight files before anything loads them (no torch import).

A directory with `config.json` but no weights, a `model.safetensors` cut short by a crash or a failed copy,
or an index naming a missing shard would otherwise fail deep inside transformers or vLLM with a long
traceback. `check_weights` reads only each safetensors header (8-byte length + JSON), checks that every
weight file is a readable file (not a dangling or looping symlink), that every entry's shape and dtype match its
data offsets, and compares the largest tensor end offset with the file size. `check_fits_in_memory` refuses
weights that would not fit in the memory available (a huge model on a small machine):

    check_weights("runs/sft/final", "model.path")
    # FileNotFoundError: model.path 'runs/sft/final': no weights (model.safetensors, *.safetensors or ...)
    # ValueError: model.path 'runs/x/final': model.safetensors is truncated (1048576 of 4194432 bytes)
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

MAX_HEADER_BYTES = 100 << 20
DTYPE_BYTES: dict[str, int] = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1}
DTYPE_BYTES |= {"U8": 1, "U16": 2, "U32": 4, "U64": 8, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "C64": 8}


def _entry_problem(name: str, entry: Any) -> str | None:
    """Why one header entry does not describe a tensor (bad shape, offsets that do not fit its dtype), or None."""
    if not isinstance(entry, dict) or not isinstance(entry.get("dtype"), str):
        return f"tensor {name[:80]!r} has no dtype"
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        return f"tensor {name[:80]!r} has a bad shape {str(shape)[:60]}"
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
        return f"tensor {name[:80]!r} has bad data_offsets {str(offsets)[:60]}"
    width = DTYPE_BYTES.get(entry["dtype"])  # sub-byte dtypes (F4, F6_*): offsets not checked
    if offsets[0] < 0 or offsets[1] < offsets[0] or (width and offsets[1] - offsets[0] != math.prod(shape) * width):
        return f"tensor {name[:80]!r}: shape {shape} {entry['dtype']} does not match data_offsets {offsets}"
    return None


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """(the tensor entries of safetensors file `path`, bytes before its data); ValueError (the reason) if unreadable."""
    if not path.is_file():
        raise ValueError(f"{path.name} is not a readable file (a dangling or looping symlink, or a directory)")
    size = path.stat().st_size
    if size < 8:
        raise ValueError(f"{path.name} is truncated ({size} bytes: not even a header)")
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        if length > MAX_HEADER_BYTES or 8 + length > size:
            raise ValueError(f"{path.name} is truncated or not safetensors (header of {length} bytes, file of {size})")
        try:
            header = json.loads(handle.read(length))
        except (ValueError, RecursionError):
            header = None
    if not isinstance(header, dict):
        raise ValueError(f"{path.name} has an unreadable header (not safetensors, or damaged)")
    return {key: entry for key, entry in header.items() if key != "__metadata__"}, 8 + length


def _safetensors_problem(path: Path) -> str | None:
    """Why a safetensors file cannot be loaded (not a file, truncated, bad header or entry), or None."""
    try:
        entries, data_start = read_header(path)
    except ValueError as err:
        return str(err)
    for name, entry in entries.items():
        problem = _entry_problem(name, entry)
        if problem:
            return f"{path.name}: {problem}"
    size, needed = path.stat().st_size, data_start + max((e["data_offsets"][1] for e in entries.values()), default=0)
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


def weight_bytes(model_dir: str | Path, bytes_per_weight: int | None = None) -> int:
    """Bytes of every tensor in the dir's safetensors files as stored, or at `bytes_per_weight` bytes per element
    (headers only; 0 for .bin weights)."""
    root = Path(model_dir)
    files = _indexed_shards(root) or sorted(root.glob("*.safetensors"))
    entries = [entry for path in files for entry in read_header(path)[0].values()]
    return sum(math.prod(e["shape"]) * (bytes_per_weight or DTYPE_BYTES.get(e["dtype"], 1)) for e in entries)


def available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where there is none)."""
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return None
    found = [int(line.split()[1]) * 1024 for line in lines if line.startswith("MemAvailable:")]
    return found[0] if found else None


def check_fits_in_memory(model_dir: str | Path, what: str, bytes_per_weight: int | None = None) -> None:
    """ValueError (one line) when loading the dir's weights (as stored, or at `bytes_per_weight` bytes each) needs
    more than the memory available now, instead of the kernel's OOM kill part way. Call after `check_weights`."""
    needed, free = weight_bytes(model_dir, bytes_per_weight), available_memory()
    if free is not None and needed > free:
        raise ValueError(
            f"{what} {str(model_dir)!r}: loading its weights needs {needed / 2**30:.1f} GiB, "
            f"{free / 2**30:.1f} GiB of memory is available"
        )


def check_model_source(source: Path, what: str) -> None:
    """FileNotFoundError / ValueError (one line naming `what`) for a dir a command cannot read a model from: no
    config.json, absurd config values (k2post.models.config_check), missing or damaged weights."""
    from k2post.models.config_check import check_model_config, read_config_json

    if not (source / "config.json").is_file():
        raise FileNotFoundError(f"{what} {source}: not an HF model dir (no config.json)")
    check_model_config(read_config_json(source / "config.json"), f"{what} {source / 'config.json'}")
    check_weights(source, what)


def shape_mismatch(model_dir: str | Path, expected: dict[str, tuple[int, ...]]) -> str | None:
    """The first weight whose stored shape differs from `expected` ({name: shape}, e.g. a meta model's
    state dict), as one phrase naming both shapes; None when every name both know agrees."""
    root = Path(model_dir)
    for path in _indexed_shards(root) or sorted(root.glob("*.safetensors")):
        for name, entry in read_header(path)[0].items():
            want = expected.get(name)
            if want is not None and tuple(entry["shape"]) != tuple(want):
                return f"{name} is {list(entry['shape'])} in {path.name} but {list(want)} by config.json"
    return None
