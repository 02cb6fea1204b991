"""The concepts of a run: events, engine, state, time, algorithms, callbacks.

Nothing in this package imports ``torch.distributed`` or the rest of cadence. Names are
imported on first use (:mod:`cadence._lazy`), so ``cadence.trainer.core.time`` (the Time
string parser, used when a run file is checked) loads without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cadence._lazy import lazy_exports

if TYPE_CHECKING:
    from cadence.trainer.core.algorithm import Algorithm
    from cadence.trainer.core.callback import Callback
    from cadence.trainer.core.engine import Engine
    from cadence.trainer.core.event import Event
    from cadence.trainer.core.state import Evaluator, State
    from cadence.trainer.core.time import Time, TimeLike, Timestamp, TimeUnit

__all__ = ["Algorithm", "Callback", "Engine", "Event", "Evaluator", "State", "Time", "TimeLike",
           "TimeUnit", "Timestamp"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "Algorithm": "cadence.trainer.core.algorithm",
    "Callback": "cadence.trainer.core.callback",
    "Engine": "cadence.trainer.core.engine",
    "Event": "cadence.trainer.core.event",
    "Evaluator": "cadence.trainer.core.state",
    "State": "cadence.trainer.core.state",
    "Time": "cadence.trainer.core.time",
    "TimeLike": "cadence.trainer.core.time",
    "TimeUnit": "cadence.trainer.core.time",
    "Timestamp": "cadence.trainer.core.time",
})
