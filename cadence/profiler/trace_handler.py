"""The :class:`TraceHandler` base class: where the profiler's events are written.

Source: MosaicML Composer's ``composer.profiler.TraceHandler`` (same methods and arguments).
Also :func:`format_trace_name`, the file-name fields trace files may use.
"""

from __future__ import annotations

import pathlib
from typing import TYPE_CHECKING, Sequence, Union

from cadence.core import Callback
from cadence.utils import dist

if TYPE_CHECKING:
    from cadence.core import State, Timestamp

__all__ = ["TraceHandler", "format_trace_name"]


def format_trace_name(template: str, state: State, with_time: bool = True) -> str:
    """``template`` with Composer's fields filled in: ``{run_name}``, ``{rank}``,
    ``{local_rank}``, ``{node_rank}``, ``{world_size}``, ``{local_world_size}`` and, with
    ``with_time``, the timestamp's ``{epoch}``, ``{batch}``, ``{batch_in_epoch}``,
    ``{sample}``, ``{sample_in_epoch}``, ``{token}``, ``{token_in_epoch}``.

    Raises:
        ValueError: another field (the message lists the known ones).
    """
    values: dict[str, Union[int, str]] = {
        "run_name": state.run_name, "rank": dist.get_global_rank(),
        "local_rank": dist.get_local_rank(), "node_rank": dist.get_node_rank(),
        "world_size": dist.get_world_size(), "local_world_size": dist.get_local_world_size(),
    }
    if with_time:
        ts = state.timestamp
        values.update(epoch=int(ts.epoch), batch=int(ts.batch),
                      batch_in_epoch=int(ts.batch_in_epoch), sample=int(ts.sample),
                      sample_in_epoch=int(ts.sample_in_epoch), token=int(ts.token),
                      token_in_epoch=int(ts.token_in_epoch))
    try:
        return template.format(**values)
    except (KeyError, IndexError) as exc:
        raise ValueError(f"Trace file name {template!r} has an unknown field {exc}; known: "
                         f"{', '.join('{' + k + '}' for k in values)}.") from None


class TraceHandler(Callback):
    """Base class for trace handlers: the :class:`~cadence.profiler.Profiler` passes each
    recorded event here (Composer's interface); a handler writes them somewhere. Every
    method is a no-op by default. Times are ``time.time_ns()`` wall clocks; ``global_rank``
    is the process's rank and ``pid`` its operating-system id.
    """

    def process_duration_event(self, name: str, categories: Union[list[str], tuple[str, ...]],
                               is_start: bool, timestamp: Timestamp, wall_clock_time_ns: int,
                               global_rank: int, pid: int) -> None:
        """A duration's start (``is_start``) or end, e.g. an event's or a marker's."""
        del name, categories, is_start, timestamp, wall_clock_time_ns, global_rank, pid

    def process_instant_event(self, name: str, categories: Union[list[str], tuple[str, ...]],
                              timestamp: Timestamp, wall_clock_time_ns: int, global_rank: int,
                              pid: int) -> None:
        """A point in time."""
        del name, categories, timestamp, wall_clock_time_ns, global_rank, pid

    def process_counter_event(self, name: str, categories: Union[list[str], tuple[str, ...]],
                              timestamp: Timestamp, wall_clock_time_ns: int, global_rank: int,
                              pid: int, values: dict[str, Union[int, float]]) -> None:
        """Counter values at a point in time (e.g. CPU and memory use)."""
        del name, categories, timestamp, wall_clock_time_ns, global_rank, pid, values

    def process_chrome_json_trace_file(self, filepath: pathlib.Path) -> None:
        """A trace file in Chrome JSON format written by another profiler (the torch
        profiler's), to be merged into this handler's traces."""
        del filepath


def as_handlers(trace_handlers: Union[TraceHandler, Sequence[TraceHandler], None]
                ) -> list[TraceHandler]:
    """``trace_handlers`` as a list, each checked to be a :class:`TraceHandler`.

    Raises:
        TypeError: an entry that is not a TraceHandler.
    """
    if trace_handlers is None:
        return []
    handlers = [trace_handlers] if isinstance(trace_handlers, TraceHandler) else list(trace_handlers)
    for handler in handlers:
        if not isinstance(handler, TraceHandler):
            raise TypeError(f"trace_handlers takes TraceHandler instances (e.g. "
                            f"JSONTraceHandler(folder=...)), got {type(handler).__name__}.")
    return handlers
