"""Where logged metrics go: :class:`Logger` fans them out to :class:`LoggerDestination` s.

Built-in destinations (registered under the names in brackets): :class:`ProgressBarLogger`
(``progress_bar``), :class:`ConsoleLogger` (``console``), :class:`FileLogger` (``file``),
:class:`InMemoryLogger` (``in_memory``), :class:`WandBLogger` (``wandb``; needs
``pip install wandb``, imported only when its run starts), :class:`TensorboardLogger`
(``tensorboard``; needs ``pip install tensorboard``), :class:`MLFlowLogger` (``mlflow``; needs
``pip install mlflow``). Importing this package registers them.
"""

from __future__ import annotations

import sys
from typing import Optional, TextIO, Union

from cadence.trainer.core.time import Time
from cadence.trainer.loggers.console import ConsoleLogger
from cadence.trainer.loggers.file_logger import FileLogger
from cadence.trainer.loggers.in_memory import InMemoryLogger
from cadence.trainer.loggers.logger import Logger, LoggerDestination, to_python
from cadence.trainer.loggers.mlflow_logger import MLFlowLogger
from cadence.trainer.loggers.progress_bar import ProgressBarLogger
from cadence.trainer.loggers.tensorboard_logger import TensorboardLogger, TensorBoardLogger
from cadence.trainer.loggers.wandb_logger import WandBLogger

__all__ = [
    "Logger", "LoggerDestination", "to_python", "ConsoleLogger", "FileLogger",
    "InMemoryLogger", "ProgressBarLogger", "WandBLogger", "default_progress_destination",
    "TensorboardLogger", "TensorBoardLogger", "MLFlowLogger",
]


def default_progress_destination(
    progress_bar: bool, console_log_interval: Union[int, str, Time] = 10,
    stream: Optional[TextIO] = None,
) -> Optional[LoggerDestination]:
    """The destination that shows a run's progress on stdout.

    A tqdm :class:`ProgressBarLogger` when stdout is a terminal; otherwise (CI logs, files,
    pipes, where a bar would write carriage returns) a :class:`ConsoleLogger` that prints a
    plain line every ``console_log_interval``. Both print on rank zero only.

    Args:
        progress_bar: whether to show progress at all; ``False`` gives ``None``.
        console_log_interval: the :class:`ConsoleLogger` interval (``int`` batches, or
            ``"10ba"`` / ``"1ep"``), used when stdout is not a terminal.
        stream: where to write; default ``sys.stdout`` (looked up at write time).

    Returns:
        The destination to add to the run's loggers, or ``None``.
    """
    if not progress_bar:
        return None
    try:
        on_terminal = bool((stream or sys.stdout).isatty())
    except (AttributeError, ValueError, OSError):  # replaced, closed or detached stdout
        on_terminal = False
    if on_terminal:
        return ProgressBarLogger(stream=stream)
    return ConsoleLogger(log_interval=console_log_interval, stream=stream)
