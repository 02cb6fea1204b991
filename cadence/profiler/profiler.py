"""The :class:`Profiler`: one schedule, the profilers it drives (system, torch, markers)
and the trace handlers they write to; ``Trainer(profiler=...)``.

Source: MosaicML Composer's ``composer.profiler.Profiler`` (same arguments and defaults;
object-store names in ``torch_prof_remote_file_name`` are upload names for the run's file
destinations).
"""

from __future__ import annotations

import logging
import pathlib
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union

from cadence.core import Callback
from cadence.profiler.marker import Marker
from cadence.profiler.profiler_action import ProfilerAction
from cadence.profiler.system_profiler import SystemProfiler
from cadence.profiler.torch_profiler import TorchProfiler
from cadence.profiler.trace_handler import TraceHandler, as_handlers

if TYPE_CHECKING:
    from cadence.core import State

__all__ = ["Profiler", "bind_profilers"]

log = logging.getLogger(__name__)

_RECORDED = (ProfilerAction.WARMUP, ProfilerAction.ACTIVE, ProfilerAction.ACTIVE_AND_SAVE)


class Profiler(Callback):
    """Profiles training batches on a schedule, writing every profiler's events through
    the trace handlers.

    Pass it as ``Trainer(profiler=Profiler(...))``: the Trainer binds it to the run's
    state (``state.profiler``) and adds its profilers and trace handlers as callbacks. The
    Engine then records each event's duration (``event/<name>``, category ``event``) on the
    batches the schedule records; :meth:`marker` records any span of your own.

    Args:
        schedule: ``(state) -> ProfilerAction`` per batch, e.g.
            :func:`~cadence.profiler.cyclic_schedule`.
        trace_handlers: where events are written, e.g.
            ``[JSONTraceHandler(folder="traces")]``.
        sys_prof_cpu, sys_prof_memory, sys_prof_disk, sys_prof_net: host counters to sample
            (:class:`~cadence.profiler.SystemProfiler`; defaults CPU only).
        sys_prof_stats_thread_interval_seconds: seconds between samples (default 0.5).
        torch_prof_folder, torch_prof_filename, torch_prof_remote_file_name,
        torch_prof_memory_filename, torch_prof_memory_remote_file_name,
        torch_prof_overwrite, torch_prof_use_gzip, torch_prof_record_shapes,
        torch_prof_profile_memory, torch_prof_with_stack, torch_prof_with_flops,
        torch_prof_num_traces_to_keep: the :class:`~cadence.profiler.TorchProfiler`'s
            arguments, same defaults; it is added when any of ``record_shapes``,
            ``profile_memory``, ``with_stack``, ``with_flops`` is on (as Composer).

    Attributes:
        resumption_batch_idx: the batch in its epoch the run resumed at (``AFTER_LOAD``);
            :func:`~cadence.profiler.cyclic_schedule` skips that many more batches.
        state: the bound State, once bound.

    Raises:
        TypeError: a trace handler that is not a :class:`TraceHandler`.
        ValueError: bad ``TorchProfiler`` / ``SystemProfiler`` arguments.
    """

    def __init__(
        self,
        schedule: Callable[[State], ProfilerAction],
        trace_handlers: Union[TraceHandler, Sequence[TraceHandler]],
        sys_prof_cpu: bool = True,
        sys_prof_memory: bool = False,
        sys_prof_disk: bool = False,
        sys_prof_net: bool = False,
        sys_prof_stats_thread_interval_seconds: float = 0.5,
        torch_prof_folder: str = "{run_name}/torch_traces",
        torch_prof_filename: str = "rank{rank}.{batch}.pt.trace.json",
        torch_prof_remote_file_name: Optional[str] = "{run_name}/torch_traces/rank{rank}.{batch}.pt.trace.json",
        torch_prof_memory_filename: Optional[str] = None,
        torch_prof_memory_remote_file_name: Optional[str] = (
            "{run_name}/torch_memory_traces/rank{rank}.{batch}.pt.memory_trace.html"),
        torch_prof_overwrite: bool = False,
        torch_prof_use_gzip: bool = False,
        torch_prof_record_shapes: bool = False,
        torch_prof_profile_memory: bool = True,
        torch_prof_with_stack: bool = False,
        torch_prof_with_flops: bool = True,
        torch_prof_num_traces_to_keep: int = -1,
    ) -> None:
        if not callable(schedule):
            raise TypeError(f"Profiler schedule must be a function (state) -> ProfilerAction, "
                            f"e.g. cyclic_schedule(); got {type(schedule).__name__}.")
        self.schedule = schedule
        self._trace_handlers = as_handlers(trace_handlers)
        self.state: Optional[State] = None
        self.resumption_batch_idx = 0
        self._markers: dict[str, Marker] = {}
        self._callbacks: list[Callback] = []
        if sys_prof_cpu or sys_prof_memory or sys_prof_disk or sys_prof_net:
            self._callbacks.append(SystemProfiler(
                profile_cpu=sys_prof_cpu, profile_memory=sys_prof_memory,
                profile_disk=sys_prof_disk, profile_net=sys_prof_net,
                stats_thread_interval_seconds=sys_prof_stats_thread_interval_seconds))
        if (torch_prof_record_shapes or torch_prof_profile_memory or torch_prof_with_stack
                or torch_prof_with_flops):
            self._callbacks.append(TorchProfiler(
                folder=torch_prof_folder, filename=torch_prof_filename,
                remote_file_name=torch_prof_remote_file_name,
                memory_filename=torch_prof_memory_filename,
                memory_remote_file_name=torch_prof_memory_remote_file_name,
                overwrite=torch_prof_overwrite, use_gzip=torch_prof_use_gzip,
                record_shapes=torch_prof_record_shapes,
                profile_memory=torch_prof_profile_memory, with_stack=torch_prof_with_stack,
                with_flops=torch_prof_with_flops, num_traces_to_keep=torch_prof_num_traces_to_keep))

    @property
    def trace_handlers(self) -> list[TraceHandler]:
        """The trace handlers (assign a handler or a list to replace them)."""
        return self._trace_handlers

    @trace_handlers.setter
    def trace_handlers(self, trace_handlers: Union[TraceHandler, Sequence[TraceHandler]]) -> None:
        self._trace_handlers[:] = as_handlers(trace_handlers)

    def bind_to_state(self, state: State) -> None:
        """Attach to ``state`` (the Trainer does it): ``state.profiler`` becomes this
        profiler, and it, its profilers and its trace handlers join ``state.callbacks``
        (each once), the handlers last so they see the profilers' output of a batch."""
        self.state = state
        state.profiler = self
        for callback in (self, *self._callbacks, *self._trace_handlers):
            if not any(c is callback for c in state.callbacks):
                state.callbacks.append(callback)

    def record_chrome_json_trace_file(self, filepath: Union[str, pathlib.Path]) -> None:
        """Merge a Chrome JSON trace written by another profiler (the torch profiler) into
        every trace handler's output."""
        for handler in self._trace_handlers:
            handler.process_chrome_json_trace_file(pathlib.Path(filepath))

    def marker(self, name: str, actions: Sequence[ProfilerAction] = _RECORDED,
               record_instant_on_start: bool = False, record_instant_on_finish: bool = False,
               categories: Union[list[str], tuple[str, ...]] = ()) -> Marker:
        """The :class:`~cadence.profiler.Marker` called ``name`` (made on first use), which
        records on the batches whose action is in ``actions`` (default: warm-up and active).

        Raises:
            RuntimeError: the profiler is not bound to a state yet.
        """
        if self.state is None:
            raise RuntimeError("Profiler.marker() needs the profiler bound to the run: pass it "
                               "as Trainer(profiler=...) (or call bind_to_state(state)).")
        marker = self._markers.get(name)
        if marker is None:
            wanted = tuple(actions)
            marker = Marker(self.state, lambda state: self.schedule(state) in wanted,
                            self._trace_handlers, name, record_instant_on_start,
                            record_instant_on_finish, categories)
            self._markers[name] = marker
        marker.categories = categories
        return marker

    def after_load(self, state: State, logger: Any) -> None:
        del logger
        self.resumption_batch_idx = int(state.timestamp.batch_in_epoch)


def bind_profilers(state: State) -> None:
    """Bind the run's :class:`Profiler`, if one is among ``state.callbacks`` (the Trainer's
    ``profiler`` argument lands there), to ``state`` before the Engine is built.

    Raises:
        ValueError: more than one Profiler.
    """
    found = [c for c in state.callbacks if isinstance(c, Profiler)]
    if len(found) > 1:
        raise ValueError(f"A run takes one Profiler; got {len(found)} "
                         f"({', '.join(type(p).__name__ for p in found)}).")
    for profiler in found:
        profiler.bind_to_state(state)
