"""Exception types of the checkpoint engine.

Every error the engine raises on purpose subclasses `CheckpointEngineError`; the others also
subclass the matching builtin so generic handlers (`except TimeoutError`) keep working.
"""

from __future__ import annotations


class CheckpointEngineError(RuntimeError):
    """Base class of all checkpoint-engine errors."""


class MetadataError(CheckpointEngineError, ValueError):
    """Tensor/bucket metadata is invalid (unknown dtype, overrun, shape or name mismatch)."""


class PeerGoneError(CheckpointEngineError, ConnectionError):
    """The peer process closed the control connection (it exited, crashed or was killed)."""


class PeerTimeoutError(CheckpointEngineError, TimeoutError):
    """The peer did not answer within the configured timeout (stuck or dead)."""


class ReceiverError(CheckpointEngineError):
    """The receiver reported a failure (bad metadata, checksum mismatch, `load` raised)."""


class IntegrityError(CheckpointEngineError):
    """A bucket's checksum in the IPC buffer does not match the one the owner rank computed."""
