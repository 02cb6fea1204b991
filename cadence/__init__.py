"""cadence: a PyTorch trainer framework in the style of MosaicML Composer.

A :class:`Trainer` drives a :class:`ComposerModel` through the events of :class:`Event`;
:class:`Algorithm` s change the run, :class:`Callback` s observe it, ``cadence.dist`` holds
the distributed helpers.

Every name is imported on first use (``cadence.Trainer``, ``from cadence import Trainer``), so
``import cadence`` imports neither torch nor transformers and ``cadence --help`` answers at
once (see :mod:`cadence._lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cadence._lazy import lazy_exports

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time each is imported on first use
    from cadence import dist
    from cadence.models.base import ComposerModel
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

__getattr__, __dir__ = lazy_exports(__name__, {
    "Algorithm": "cadence.trainer.core.algorithm",
    "Callback": "cadence.trainer.core.callback",
    "ComposerModel": "cadence.models.base",
    "Engine": "cadence.trainer.core.engine",
    "Evaluator": "cadence.trainer.core.state",
    "Event": "cadence.trainer.core.event",
    "Logger": "cadence.trainer.loggers.logger",
    "LoggerDestination": "cadence.trainer.loggers.logger",
    "State": "cadence.trainer.core.state",
    "Time": "cadence.trainer.core.time",
    "TimeUnit": "cadence.trainer.core.time",
    "Timestamp": "cadence.trainer.core.time",
    "Trainer": "cadence.trainer.trainer",
    "dist": "cadence.dist",
})
