"""The concepts of a run: events, engine, state, time, algorithms, callbacks.

Nothing in this package imports ``torch.distributed`` or the rest of cadence.
"""

from cadence.trainer.core.algorithm import Algorithm
from cadence.trainer.core.callback import Callback
from cadence.trainer.core.engine import Engine
from cadence.trainer.core.event import Event
from cadence.trainer.core.state import Evaluator, State
from cadence.trainer.core.time import Time, TimeLike, Timestamp, TimeUnit

__all__ = ["Algorithm", "Callback", "Engine", "Event", "Evaluator", "State", "Time", "TimeLike",
           "TimeUnit", "Timestamp"]
