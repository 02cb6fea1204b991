""":class:`ProfilerAction`: what the profiler does on a batch.

Source: MosaicML Composer's ``composer.profiler.ProfilerAction`` (same members and values).
"""

from __future__ import annotations

from enum import Enum

__all__ = ["ProfilerAction"]


class ProfilerAction(str, Enum):
    """The profiler's action on one training batch, from its schedule.

    Attributes:
        SKIP: record nothing.
        WARMUP: run the profilers but keep nothing (their start-up cost stays out of traces).
        ACTIVE: record.
        ACTIVE_AND_SAVE: record, then write the window's traces at the batch's end.
    """

    SKIP = "skip"
    WARMUP = "warmup"
    ACTIVE = "active"
    ACTIVE_AND_SAVE = "active_and_save"
