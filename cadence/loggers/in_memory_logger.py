"""The :class:`InMemoryLogger`: keeps everything logged in Python lists, for tests and
notebooks.

Source: MosaicML Composer's ``InMemoryLogger`` (``composer/loggers/in_memory_logger.py``):
same attributes (``data`` of ``(Timestamp, value)``, ``most_recent_values``,
``most_recent_timestamps``, ``hyperparameters``, ``tables``) and ``get_timeseries``.
"""

from __future__ import annotations

import datetime
import json
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

import numpy as np

from cadence.loggers.logger_destination import LoggerDestination, to_python
from cadence.registry import loggers

if TYPE_CHECKING:
    from cadence.core.state import State
    from cadence.core.time import Timestamp

__all__ = ["InMemoryLogger", "MetricNotLoggedError"]


class MetricNotLoggedError(KeyError, ValueError):
    """A metric that was never logged was asked for. A ``ValueError`` as in Composer, and a
    ``KeyError`` as a missing key is."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


def _time_value(value: Any) -> float | int:
    """A Timestamp field as a number: seconds for wall-clock fields, the count otherwise."""
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    inner = getattr(value, "value", value)  # a Time
    return inner.total_seconds() if isinstance(inner, datetime.timedelta) else inner


@loggers.register("in_memory")
class InMemoryLogger(LoggerDestination):
    """Records every metric on every rank, converted to Python numbers when logged.

    Converting at log time reads device tensors at once (a host sync per call), which is
    fine for tests, not for fast training runs.

    Attributes:
        data: metric name -> ``[(Timestamp, value), ...]`` in the order logged; the
            Timestamp is the run's ``state.timestamp`` at the call (``None`` when the logger
            was not given a State through ``init``, i.e. used without a Trainer).
        most_recent_values: metric name -> its last value.
        most_recent_timestamps: metric name -> the Timestamp of its last value.
        most_recent_steps: metric name -> the ``step`` of its last value (cadence's; the
            step a destination was given, by default ``state.timestamp.batch``).
        hyperparameters: everything passed to ``log_hyperparameters``, merged.
        tables: table name -> the table as JSON (``{"columns": [...], "data": [[...]]}``,
            pandas' ``orient='split'`` layout, as Composer stores it).

    Differences from Composer, on purpose: values are Python numbers (tensors are read
    with ``.item()`` / ``.tolist()`` when logged; Composer keeps a deep copy of the tensor,
    so ``value.item()`` there is ``value`` here), and :meth:`log_table` needs no pandas.
    """

    def __init__(self) -> None:
        self.data: dict[str, list[tuple[Optional[Timestamp], Any]]] = {}
        self.most_recent_values: dict[str, Any] = {}
        self.most_recent_timestamps: dict[str, Optional[Timestamp]] = {}
        self.most_recent_steps: dict[str, Optional[int]] = {}
        self.hyperparameters: dict[str, Any] = {}
        self.tables: dict[str, str] = {}
        self.state: Optional[State] = None
        self._steps: dict[str, list[Optional[int]]] = {}

    def init(self, state: State, logger: Any) -> None:
        """Keep ``state`` to timestamp what is logged."""
        del logger
        self.state = state

    def log_metrics(self, metrics: Mapping[str, Any], step: Optional[int] = None) -> None:
        """Append ``(state.timestamp, value)`` for each metric."""
        timestamp = None if self.state is None else self.state.timestamp
        for key, value in metrics.items():
            value = to_python(value)
            self.data.setdefault(key, []).append((timestamp, value))
            self._steps.setdefault(key, []).append(step)
            self.most_recent_values[key] = value
            self.most_recent_timestamps[key] = timestamp
            self.most_recent_steps[key] = step

    def log_hyperparameters(self, hyperparameters: Mapping[str, Any]) -> None:
        """Merge ``hyperparameters`` into :attr:`hyperparameters`."""
        self.hyperparameters.update(hyperparameters)

    def log_table(self, columns: Sequence[str], rows: Sequence[Sequence[Any]],
                  name: str = "Table", step: Optional[int] = None) -> None:
        """Store the table under ``name`` as JSON ``{"columns": [...], "data": [[...], ...]}``.

        Raises:
            ValueError: a row's length differs from the number of columns.
        """
        del step
        for index, row in enumerate(rows):
            if len(row) != len(columns):
                raise ValueError(f"log_table {name!r}: row {index} has {len(row)} values for "
                                 f"{len(columns)} columns {list(columns)}.")
        self.tables[name] = json.dumps(
            {"columns": list(columns), "data": [[to_python(v) for v in row] for row in rows]},
            ensure_ascii=False, default=str)

    def _require(self, name: str) -> None:
        if name not in self.data:
            raise MetricNotLoggedError(
                f"Metric {name!r} was never logged; logged: {sorted(self.data)}.")

    def get_timeseries(self, metric: str) -> dict[str, np.ndarray]:
        """The values logged for ``metric`` and the time of each, as NumPy arrays.

        Returns:
            ``{metric: values, "epoch": [...], "batch": [...], "sample": [...], ...}``: one
            key per :class:`~cadence.Timestamp` field (wall-clock fields in seconds), each
            array as long as ``values``. Plot with
            ``plt.plot(ts["batch"], ts["loss/train/total"])``.

        Raises:
            MetricNotLoggedError (a ValueError and KeyError): ``metric`` was never logged
                (the message lists what was).
            ValueError: values were logged without a State (no ``init``), so have no time.
        """
        self._require(metric)
        series: dict[str, list[Any]] = {metric: []}
        for timestamp, value in self.data[metric]:
            if timestamp is None:
                raise ValueError(f"{metric!r} was logged before the InMemoryLogger got a State "
                                 f"(Event.INIT); use steps_and_values() for its steps.")
            series[metric].append(value)
            for field, time in timestamp.state_dict().items():
                series.setdefault(field, []).append(_time_value(time))
        return {key: np.array(values) for key, values in series.items()}

    def steps_and_values(self, metric: str) -> tuple[list[Optional[int]], list[Any]]:
        """The steps (as given to ``log_metrics``, by default ``timestamp.batch``) and the
        values logged for ``metric``, as two lists (cadence's; works without a State).

        Raises:
            MetricNotLoggedError: ``metric`` was never logged.
        """
        self._require(metric)
        return list(self._steps[metric]), [value for _, value in self.data[metric]]
