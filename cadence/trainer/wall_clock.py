"""The wall clock behind the timestamp's ``*_wct`` clocks: seconds between batches (or epoch
ends, or the start of ``fit``), agreed over ranks when a duration is in seconds."""

from __future__ import annotations

import datetime
import time
from typing import Any

import torch

from cadence.core import State, TimeUnit
from cadence.utils import dist

__all__ = ["WallClock"]


class WallClock:
    """Laps of wall-clock time; :meth:`start` at ``fit``, :meth:`lap` at each batch end."""

    def __init__(self) -> None:
        self._last = time.perf_counter()

    def start(self) -> None:
        """Count from now (``timestamp.total_wct`` counts from ``fit``'s start)."""
        self._last = time.perf_counter()

    def lap(self, state: State, eval_interval: Any) -> datetime.timedelta:
        """Wall clock since the last lap. When ``max_duration`` or ``eval_interval`` is in
        ``sec``, every rank takes rank 0's, so all ranks stop and evaluate at the same batch."""
        now = time.perf_counter()
        seconds, self._last = now - self._last, now
        if dist.get_world_size() > 1 and TimeUnit.SECOND in (
                getattr(state.max_duration, "unit", None), getattr(eval_interval, "unit", None)):
            shared = torch.tensor([seconds], dtype=torch.float64, device=state.device)
            dist.broadcast(shared, src=0)
            seconds = float(shared.item())
        return datetime.timedelta(seconds=seconds)
