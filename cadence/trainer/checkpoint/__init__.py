"""Checkpoints: full (one file) and sharded (DCP) formats, atomic saves, exact resume."""

from cadence.trainer.checkpoint.checkpoint import (
    CheckpointError, SafeLoadPlanner, load_checkpoint, read_metadata, save_checkpoint,
)
from cadence.trainer.checkpoint.files import find_latest_checkpoint, is_complete

__all__ = ["CheckpointError", "SafeLoadPlanner", "find_latest_checkpoint", "is_complete",
           "load_checkpoint", "read_metadata", "save_checkpoint"]
