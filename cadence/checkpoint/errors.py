"""The errors that checkpoint reading and writing raise (one module, so every checkpoint
module can raise them without importing the others)."""

from __future__ import annotations

__all__ = ["CheckpointError", "CheckpointWriteError"]


class CheckpointError(ValueError):
    """A checkpoint is missing, truncated, corrupt, holds an object that is not allowed in a
    checkpoint, or does not fit the run. The message names the file and what to do."""


class CheckpointWriteError(OSError):
    """A save failed while writing (for example no space left on device). The message names
    the file being written and the previous checkpoint, which is intact; the failed save's
    temporary has been removed. ``errno`` is the underlying error's."""
