"""``cadence.core``: Composer's ``composer.core`` names, so a port is ``s/composer/cadence/``.

Each name lives in one module of :mod:`cadence.trainer.core` (or
:mod:`cadence.trainer.precision`); this package re-exports them. The submodule paths
Composer users import from also resolve: ``cadence.core.time``, ``.state``, ``.event``,
``.engine``, ``.passes``, ``.algorithm``, ``.callback``, ``.precision`` are those modules.
"""

from __future__ import annotations

import sys

from cadence.trainer import precision as _precision
from cadence.trainer.core import algorithm as _algorithm
from cadence.trainer.core import callback as _callback
from cadence.trainer.core import engine as _engine
from cadence.trainer.core import event as _event
from cadence.trainer.core import passes
from cadence.trainer.core import state as _state
from cadence.trainer.core import time as _time
from cadence.trainer.core.algorithm import Algorithm
from cadence.trainer.core.callback import Callback
from cadence.trainer.core.engine import Engine, Trace, Traces
from cadence.trainer.core.event import Event
from cadence.trainer.core.passes import AlgorithmPass
from cadence.trainer.core.state import Evaluator, State
from cadence.trainer.core.time import Time, Timestamp, TimeUnit, ensure_time
from cadence.trainer.precision import Precision, get_precision_context

__all__ = [
    "Algorithm", "AlgorithmPass", "Callback", "Engine", "Evaluator", "Event", "Precision",
    "State", "Time", "Timestamp", "TimeUnit", "Trace", "Traces", "ensure_time",
    "get_precision_context", "passes",
]

for _name, _module in {"algorithm": _algorithm, "callback": _callback, "engine": _engine,
                       "event": _event, "passes": passes, "precision": _precision,
                       "state": _state, "time": _time}.items():
    sys.modules.setdefault(f"{__name__}.{_name}", _module)
