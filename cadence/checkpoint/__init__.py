"""Checkpoints: full (one file) and sharded (DCP) formats, atomic saves, exact resume.

The names below are imported on first use, so a light submodule (``.lock``, ``.files``,
``.errors``) does not pull in ``torch.distributed.checkpoint`` through this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cadence._lazy import lazy_exports

if TYPE_CHECKING:
    from cadence.checkpoint.checkpoint import (
        SafeLoadPlanner, load_checkpoint, read_metadata, save_checkpoint,
    )
    from cadence.checkpoint.errors import CheckpointError, CheckpointWriteError
    from cadence.checkpoint.files import is_complete
    from cadence.checkpoint.store import find_latest_checkpoint

__all__ = ["CheckpointError", "CheckpointWriteError", "SafeLoadPlanner",
           "find_latest_checkpoint", "is_complete", "load_checkpoint", "read_metadata",
           "save_checkpoint"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "CheckpointError": "cadence.checkpoint.errors",
    "CheckpointWriteError": "cadence.checkpoint.errors",
    "SafeLoadPlanner": "cadence.checkpoint.checkpoint",
    "find_latest_checkpoint": "cadence.checkpoint.store",
    "is_complete": "cadence.checkpoint.files",
    "load_checkpoint": "cadence.checkpoint.checkpoint",
    "read_metadata": "cadence.checkpoint.checkpoint",
    "save_checkpoint": "cadence.checkpoint.checkpoint",
})
