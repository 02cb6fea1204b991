"""Where logged metrics go: :class:`Logger` fans them out to :class:`LoggerDestination` s.

Composer's ``composer.loggers``. Built-in destinations (registered under the names in
brackets): :class:`ProgressBarLogger` (``progress_bar``), :class:`ConsoleLogger` (``console``),
:class:`FileLogger` (``file``), :class:`InMemoryLogger` (``in_memory``), :class:`WandBLogger`
(``wandb``; needs ``pip install wandb``, imported only when its run starts),
:class:`TensorboardLogger` (``tensorboard``; needs ``pip install tensorboard``),
:class:`MLFlowLogger` (``mlflow``; needs ``pip install mlflow``), :class:`RemoteUploaderDownloader`
(``remote_uploader_downloader``; object storage through fsspec). Each is imported on first
use (:mod:`cadence._lazy`); the registry imports them all on its first look-up
(:data:`_REGISTERING_MODULES`). What the last three (experiment trackers) share is in
:mod:`cadence.loggers.tracker_destination`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cadence._lazy import lazy_exports

if TYPE_CHECKING:
    from cadence.loggers.console_logger import ConsoleLogger
    from cadence.loggers.file_logger import FileLogger
    from cadence.loggers.in_memory_logger import InMemoryLogger
    from cadence.loggers.logger import Logger
    from cadence.loggers.logger_destination import LoggerDestination, to_python
    from cadence.loggers.mlflow_logger import MLFlowLogger
    from cadence.loggers.mosaicml_logger import MosaicMLLogger
    from cadence.loggers.progress_bar_logger import (
        ProgressBarLogger, default_progress_destination,
    )
    from cadence.loggers.remote_uploader_downloader import RemoteUploaderDownloader
    from cadence.loggers.tensorboard_logger import TensorboardLogger, TensorBoardLogger
    from cadence.loggers.wandb_logger import WandBLogger

_LAZY = {
    "Logger": "cadence.loggers.logger",
    "LoggerDestination": "cadence.loggers.logger_destination",
    "to_python": "cadence.loggers.logger_destination",
    "ConsoleLogger": "cadence.loggers.console_logger",
    "FileLogger": "cadence.loggers.file_logger",
    "InMemoryLogger": "cadence.loggers.in_memory_logger",
    "ProgressBarLogger": "cadence.loggers.progress_bar_logger",
    "default_progress_destination": "cadence.loggers.progress_bar_logger",
    "WandBLogger": "cadence.loggers.wandb_logger",
    "TensorboardLogger": "cadence.loggers.tensorboard_logger",
    "TensorBoardLogger": "cadence.loggers.tensorboard_logger",
    "MLFlowLogger": "cadence.loggers.mlflow_logger",
    "RemoteUploaderDownloader": "cadence.loggers.remote_uploader_downloader",
    "MosaicMLLogger": "cadence.loggers.mosaicml_logger",
}

__all__ = sorted(_LAZY)

#: The modules whose import registers the destinations in
#: :data:`cadence.registry.registry.loggers` (the registry imports them on first look-up).
_REGISTERING_MODULES = tuple(sorted(
    set(_LAZY.values()) - {"cadence.loggers.logger", "cadence.loggers.logger_destination",
                           "cadence.loggers.mosaicml_logger"}))

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
