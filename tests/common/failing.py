"""A callback that raises on one rank at one batch (for launch failure tests)."""

from __future__ import annotations

from typing import Any

from cadence import Callback, State, dist


class FailOnRank(Callback):
    """Raise ``RuntimeError`` on global rank ``rank`` at the start of batch ``batch`` (1-based)."""

    def __init__(self, rank: int = 1, batch: int = 2) -> None:
        self.rank, self.batch = rank, batch

    def batch_start(self, state: State, logger: Any) -> None:
        if dist.get_global_rank() == self.rank and state.timestamp.batch + 1 == self.batch:
            raise RuntimeError(f"deliberate failure on rank {self.rank} at batch {self.batch}")
