"""``cadence.loggers``: Composer's ``composer.loggers`` path for the logger destinations of
:mod:`cadence.trainer.loggers` (where they live): ``Logger``, ``LoggerDestination``,
``ConsoleLogger``, ``FileLogger``, ``InMemoryLogger``, ``ProgressBarLogger``, ``WandBLogger``."""

from __future__ import annotations

from cadence.trainer.loggers import *  # noqa: F401,F403
from cadence.trainer.loggers import __all__  # noqa: F401
