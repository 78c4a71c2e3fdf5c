"""Configuration of the checkpoint engine (pydantic v2, unknown keys rejected).

Used by `WeightSender`; the receiver learns everything it needs from the handshake.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from k2post_checkpoint_engine.meta import dtype_from_str


class CheckpointEngineConfig(BaseModel):
    """Knobs of one checkpoint-engine sender (one per trainer rank; identical on all ranks)."""

    model_config = ConfigDict(extra="forbid")

    bucket_nbytes: int = Field(
        256 << 20,
        ge=64,
        description="Size of one bucket in bytes; each of the 2 IPC buffers (and the GPU staging buffer) "
        "has this size.",
    )
    align_nbytes: int = Field(
        64, ge=16, description="Byte alignment of every tensor inside a bucket (power of two, >= 16)."
    )
    timeout_s: float = Field(
        60.0, gt=0, description="Seconds to wait for any handshake message or ack before raising PeerTimeoutError."
    )
    verify_checksum: bool = Field(
        True,
        description="Hash every piece from its source on the owner rank (xxh3-64); the receiver checks the bytes "
        "it got against them and names the tensor on a mismatch. Off for benchmarks.",
    )
    dtype: str | None = Field(
        None,
        description="Cast floating-point tensors to this dtype (e.g. 'bfloat16') while staging; None keeps each dtype.",
    )
    device: Literal["cpu", "cuda"] = Field(
        "cpu", description="'cpu': POSIX shm buffers + gloo; 'cuda': CUDA IPC buffers on the current device + NCCL."
    )
    host: str = Field("127.0.0.1", description="Interface the sender's control socket listens on (receiver is local).")
    port: int = Field(0, ge=0, le=65535, description="TCP port of the control socket; 0 picks a free port per rank.")
    shm_prefix: str = Field(
        "k2ce", pattern=r"^[A-Za-z0-9_]+$", description="Prefix of /dev/shm segment names: '<prefix>-<pid>-<hex>'."
    )

    @field_validator("align_nbytes")
    @classmethod
    def _power_of_two(cls, v: int) -> int:
        if v & (v - 1):
            raise ValueError(f"align_nbytes must be a power of two, got {v}")
        return v

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, v: str | None) -> str | None:
        if v is not None:
            dtype_from_str(v, "<config.dtype>")
        return v
