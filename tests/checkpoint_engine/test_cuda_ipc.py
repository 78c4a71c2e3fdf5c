"""GPU path: CUDA IPC buffers + (for 2 ranks) NCCL. Marked `gpu`: skipped without CUDA.

Run on a GPU machine: `python -m pytest tests/checkpoint_engine -m gpu -q`.
The receiver is always a separate process (CUDA IPC handles cannot be opened by their creator).
"""

from __future__ import annotations

import socket

import pytest
import torch

from k2post_checkpoint_engine.cuda_ipc import _decode, _encode
from k2post_checkpoint_engine.errors import CheckpointEngineError
from k2post_checkpoint_engine.shm import list_segments


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_handle_codec_roundtrip_and_allow_list():
    """CPU-only part of the codec: values survive JSON encoding; foreign classes are refused."""
    value = (
        torch.Tensor,
        torch.Size([3, 4]),
        (4, 1),
        0,
        torch.storage.TypedStorage,
        torch.bfloat16,
        0,
        b"\x00\xff",
        True,
        None,
    )
    assert _decode(_encode(value)) == value
    with pytest.raises(CheckpointEngineError, match="allow-list"):
        _decode({"cls": "os.system"})


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize(
    "world_size, source_device, cast", [(1, "cpu", None), (1, "cuda", "bfloat16"), (2, "cuda", None)]
)
def test_cuda_ipc_roundtrip(launcher, tmp_path, shm_prefix, world_size, source_device, cast):
    if torch.cuda.device_count() < world_size:
        pytest.skip(f"needs {world_size} GPUs")
    port = _free_port()
    config = {"bucket_nbytes": 4099, "timeout_s": 60.0, "shm_prefix": shm_prefix, "dtype": cast, "device": "cuda"}
    common = {"addr_dir": str(tmp_path), "n_updates": 2, "timeout_s": 60.0}
    senders = [
        launcher.start(
            "sender",
            {
                **common,
                "rank": r,
                "world_size": world_size,
                "master_port": port,
                "serve_ranks": list(range(world_size)),
                "config": config,
                "source_device": source_device,
            },
        )  # fmt: skip
        for r in range(world_size)
    ]
    receivers = [
        launcher.start("receiver", {**common, "rank": r, "cast": cast, "cuda": True}) for r in range(world_size)
    ]
    launcher.wait([p for p, _ in senders + receivers], timeout_s=240)
    for _, res in senders:
        launcher.result(res)
    for _, res in receivers:
        out = launcher.result(res)
        assert out["updates"] == 2 and out["mismatches"] == []
    assert list_segments(shm_prefix) == []
