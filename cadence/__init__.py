"""cadence: a PyTorch trainer framework in the style of MosaicML Composer.

A :class:`Trainer` drives a :class:`ComposerModel` through the events of :class:`Event`;
:class:`Algorithm` s change the run, :class:`Callback` s observe it, ``cadence.dist`` holds
the distributed helpers.
"""

from cadence.models.base import ComposerModel
from cadence import dist
from cadence.trainer.core import (
    Algorithm, Callback, Engine, Evaluator, Event, State, Time, Timestamp, TimeUnit,
)
from cadence.trainer.loggers.logger import Logger, LoggerDestination
from cadence.trainer.trainer import Trainer

__version__ = "0.1.0"

__all__ = [
    "Algorithm", "Callback", "ComposerModel", "Engine", "Evaluator", "Event", "Logger",
    "LoggerDestination", "State", "Time", "TimeUnit", "Timestamp", "Trainer", "dist",
    "__version__",
]
