"""Composer's ``composer.core``: the concepts of a run (events, engine, state, time,
algorithms, callbacks, evaluators, precision, batches).

The dependency rule: nothing in this package imports the rest of cadence (or
``torch.distributed``). Names are imported on first use (:mod:`cadence._lazy`), so
``cadence.core.time`` (the Time string parser, used when a run file is checked) loads without
torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cadence._lazy import lazy_exports

if TYPE_CHECKING:
    from cadence.core import passes
    from cadence.core.algorithm import Algorithm
    from cadence.core.callback import Callback
    from cadence.core.data_spec import DataSpec, ensure_data_spec
    from cadence.core.engine import Engine, Trace, Traces
    from cadence.core.evaluator import Evaluator, ensure_evaluator
    from cadence.core.event import Event
    from cadence.core.passes import AlgorithmPass
    from cadence.core.precision import Precision, get_precision_context
    from cadence.core.serializable import Serializable
    from cadence.core.state import State
    from cadence.core.time import Time, TimeLike, Timestamp, TimeUnit, ensure_time
    from cadence.core.types import (
        JSON, Batch, Dataset, MemoryFormat, PyTorchScheduler, TrainerMode,
    )

_LAZY = {
    "Algorithm": "cadence.core.algorithm",
    "AlgorithmPass": "cadence.core.passes",
    "Batch": "cadence.core.types",
    "Callback": "cadence.core.callback",
    "DataSpec": "cadence.core.data_spec",
    "Engine": "cadence.core.engine",
    "Evaluator": "cadence.core.evaluator",
    "Event": "cadence.core.event",
    "JSON": "cadence.core.types",
    "MemoryFormat": "cadence.core.types",
    "Dataset": "cadence.core.types",
    "Precision": "cadence.core.precision",
    "Serializable": "cadence.core.serializable",
    "PyTorchScheduler": "cadence.core.types",
    "State": "cadence.core.state",
    "Time": "cadence.core.time",
    "TimeLike": "cadence.core.time",
    "TimeUnit": "cadence.core.time",
    "Timestamp": "cadence.core.time",
    "Trace": "cadence.core.engine",
    "Traces": "cadence.core.engine",
    "TrainerMode": "cadence.core.types",
    "ensure_data_spec": "cadence.core.data_spec",
    "ensure_evaluator": "cadence.core.evaluator",
    "ensure_time": "cadence.core.time",
    "get_precision_context": "cadence.core.precision",
    "passes": "cadence.core.passes",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
