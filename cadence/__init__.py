"""cadence: a PyTorch trainer framework in the style of MosaicML Composer.

A :class:`Trainer` drives a :class:`ComposerModel` through the events of :class:`Event`;
:class:`Algorithm` s change the run, :class:`Callback` s observe it, ``cadence.dist`` holds
the distributed helpers.

Every name is imported on first use (``cadence.Trainer``, ``from cadence import Trainer``), so
``import cadence`` imports neither torch nor transformers and ``cadence --help`` answers at
once (see :mod:`cadence._lazy`). Every subpackage is reachable as an attribute the same way
(``import cadence; cadence.optim.DecoupledAdamW``), as in Composer. The layout is described
in ``docs/architecture.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cadence._lazy import lazy_exports

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time each is imported on first use
    from cadence import (
        algorithms, callbacks, checkpoint, config, core, data, devices, dist, functional, launch,
        loggers, loss, metrics, models, optim, parallel, profiler, trainer, utils,
    )
    from cadence.core.algorithm import Algorithm
    from cadence.core.callback import Callback
    from cadence.core.data_spec import DataSpec
    from cadence.core.engine import Engine
    from cadence.core.evaluator import Evaluator
    from cadence.core.event import Event
    from cadence.core.state import State
    from cadence.core.time import Time, Timestamp, TimeUnit
    from cadence.loggers.logger import Logger
    from cadence.loggers.logger_destination import LoggerDestination
    from cadence.models.base import ComposerModel
    from cadence.trainer.trainer import Trainer

from cadence._version import __version__

#: Subpackages, imported on first attribute access (``cadence.optim``).
SUBPACKAGES = (
    "algorithms", "callbacks", "checkpoint", "config", "core", "data", "devices", "dist",
    "distributed", "functional", "launch", "loggers", "loss", "metrics", "models", "optim",
    "parallel", "planning", "profiler", "registry", "trainer", "utils",
)

__all__ = [
    "Algorithm", "Callback", "ComposerModel", "DataSpec", "Engine", "Evaluator", "Event", "Logger",
    "LoggerDestination", "State", "Time", "TimeUnit", "Timestamp", "Trainer", "__version__",
    *SUBPACKAGES,
]

__getattr__, __dir__ = lazy_exports(__name__, {
    "Algorithm": "cadence.core.algorithm",
    "Callback": "cadence.core.callback",
    "ComposerModel": "cadence.models.base",
    "DataSpec": "cadence.core.data_spec",
    "Engine": "cadence.core.engine",
    "Evaluator": "cadence.core.evaluator",
    "Event": "cadence.core.event",
    "Logger": "cadence.loggers.logger",
    "LoggerDestination": "cadence.loggers.logger_destination",
    "State": "cadence.core.state",
    "Time": "cadence.core.time",
    "TimeUnit": "cadence.core.time",
    "Timestamp": "cadence.core.time",
    "Trainer": "cadence.trainer.trainer",
    **{name: f"cadence.{name}" for name in SUBPACKAGES},
})
