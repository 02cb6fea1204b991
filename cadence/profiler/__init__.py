"""Composer's ``composer.profiler``: a schedule of profiled batches, the profilers it drives
(the Engine's event durations, markers, host counters, ``torch.profiler``) and the trace
handlers that write their events (Chrome JSON).

Source: MosaicML Composer's ``composer/profiler`` (same module paths, names and
arguments). Usage::

    from cadence.profiler import JSONTraceHandler, Profiler, cyclic_schedule

    profiler = Profiler(schedule=cyclic_schedule(skip_first=1, warmup=1, active=2),
                        trace_handlers=[JSONTraceHandler(folder="traces")])
    Trainer(..., profiler=profiler).fit()
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cadence._lazy import lazy_exports

if TYPE_CHECKING:
    from cadence.profiler.json_trace_handler import JSONTraceHandler
    from cadence.profiler.marker import Marker
    from cadence.profiler.profiler import Profiler
    from cadence.profiler.profiler_action import ProfilerAction
    from cadence.profiler.profiler_schedule import cyclic_schedule
    from cadence.profiler.system_profiler import SystemProfiler
    from cadence.profiler.torch_profiler import TorchProfiler
    from cadence.profiler.trace_handler import TraceHandler

_LAZY = {
    "JSONTraceHandler": "cadence.profiler.json_trace_handler",
    "Marker": "cadence.profiler.marker",
    "Profiler": "cadence.profiler.profiler",
    "ProfilerAction": "cadence.profiler.profiler_action",
    "SystemProfiler": "cadence.profiler.system_profiler",
    "TorchProfiler": "cadence.profiler.torch_profiler",
    "TraceHandler": "cadence.profiler.trace_handler",
    "cyclic_schedule": "cadence.profiler.profiler_schedule",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
