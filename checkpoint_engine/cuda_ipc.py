"""CUDA IPC buffers: share a CUDA uint8 buffer with another local process without copying.

Uses torch's own IPC path (`torch.multiprocessing.reductions.reduce_tensor` on the producer,
`rebuild_cuda_tensor` on the consumer, i.e. cudaIpcGetMemHandle / cudaIpcOpenMemHandle with torch's
ref counting). The rebuild arguments are encoded as JSON (bytes as base64, classes/dtypes from an
allow-list) instead of pickle, so a receiver never unpickles anything from the socket.
The producer must keep the buffer alive while consumers map it (the sender holds it until close).
Consumers must see the same physical GPU; `device_index` maps the producer's index to the local one
when CUDA_VISIBLE_DEVICES differs between processes.
"""

from __future__ import annotations

import base64
from typing import Any

import torch

from k2post_checkpoint_engine.errors import CheckpointEngineError

_STORAGE_DEVICE_ARG = 6  # position of `storage_device` in rebuild_cuda_tensor's arguments


def _allowed_classes() -> dict[str, type]:
    classes: list[type] = [torch.Tensor, torch.nn.Parameter, torch.UntypedStorage, torch.storage.TypedStorage]
    return {f"{c.__module__}.{c.__qualname__}": c for c in classes}


def _encode(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes):
        return {"b64": base64.b64encode(value).decode()}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, type):
        return {"cls": f"{value.__module__}.{value.__qualname__}"}
    if isinstance(value, tuple | list | torch.Size):
        return {"tuple": [_encode(v) for v in value]}
    raise CheckpointEngineError(f"cannot encode CUDA IPC handle field of type {type(value).__name__}")


def _decode(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    if "b64" in value:
        return base64.b64decode(value["b64"])
    if "dtype" in value:
        return getattr(torch, value["dtype"])
    if "cls" in value:
        allowed = _allowed_classes()
        if value["cls"] not in allowed:
            raise CheckpointEngineError(f"CUDA IPC handle names a class outside the allow-list: {value['cls']!r}")
        return allowed[value["cls"]]
    return tuple(_decode(v) for v in value["tuple"])


def export_cuda_buffer(buf: torch.Tensor) -> dict[str, Any]:
    """JSON-able IPC handle of a CUDA tensor (producer side)."""
    from torch.multiprocessing.reductions import reduce_tensor

    if not buf.is_cuda:
        raise CheckpointEngineError("export_cuda_buffer needs a CUDA tensor")
    _rebuild, args = reduce_tensor(buf)
    return {"args": [_encode(a) for a in args]}


def import_cuda_buffer(handle: dict[str, Any], device_index: int | None = None) -> torch.Tensor:
    """Open a handle from `export_cuda_buffer` in this process (consumer side); shares memory."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    args = [_decode(a) for a in handle["args"]]
    if device_index is not None:
        args[_STORAGE_DEVICE_ARG] = device_index
    return rebuild_cuda_tensor(*args)
