"""The :class:`InMemoryLogger`: keeps everything logged in Python lists, for tests and
notebooks.

Source: MosaicML Composer's ``InMemoryLogger`` (``composer/loggers/in_memory_logger.py``).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from cadence.trainer.loggers.logger import LoggerDestination, to_python
from cadence.trainer.registry import loggers

__all__ = ["InMemoryLogger"]


@loggers.register("in_memory")
class InMemoryLogger(LoggerDestination):
    """Records every metric on every rank, converted to Python numbers when logged.

    Converting at log time reads device tensors at once (a host sync per call), which is
    fine for tests, not for fast training runs.

    Attributes:
        data: metric name -> ``[(step, value), ...]`` in the order logged.
        most_recent_values: metric name -> its last value.
        most_recent_steps: metric name -> the step of its last value.
        hyperparameters: everything passed to ``log_hyperparameters``, merged.
    """

    def __init__(self) -> None:
        self.data: dict[str, list[tuple[Optional[int], Any]]] = {}
        self.most_recent_values: dict[str, Any] = {}
        self.most_recent_steps: dict[str, Optional[int]] = {}
        self.hyperparameters: dict[str, Any] = {}

    def log_metrics(self, metrics: Mapping[str, Any], step: Optional[int] = None) -> None:
        """Append ``(step, value)`` for each metric."""
        for key, value in metrics.items():
            value = to_python(value)
            self.data.setdefault(key, []).append((step, value))
            self.most_recent_values[key] = value
            self.most_recent_steps[key] = step

    def log_hyperparameters(self, hyperparameters: Mapping[str, Any]) -> None:
        """Merge ``hyperparameters`` into :attr:`hyperparameters`."""
        self.hyperparameters.update(hyperparameters)

    def get_timeseries(self, name: str) -> tuple[list[Optional[int]], list[Any]]:
        """The steps and values logged for ``name``, as two lists.

        Raises:
            KeyError: ``name`` was never logged (the message lists what was).
        """
        if name not in self.data:
            raise KeyError(f"Metric {name!r} was never logged; logged: {sorted(self.data)}.")
        steps = [step for step, _ in self.data[name]]
        values = [value for _, value in self.data[name]]
        return steps, values
