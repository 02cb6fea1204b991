"""Composer's ``MosaicMLLogger`` and its environment variables, for code written against the
MosaicML platform (llm-foundry adds the logger when ``MOSAICML_PLATFORM`` is set).

The platform's client (``mcli``) is not part of cadence. Outside the platform the logger
behaves as Composer's does there: ``RUN_NAME`` unset, it warns once that it is disabled and
logs nothing (on every rank; Composer logs on rank 0 only, and only with a run name). With
the platform's variables set (``RUN_NAME``, or ``MOSAICML_PLATFORM=true``) Composer would
send metadata to the platform; cadence refuses at construction instead of dropping it
silently.

Source: Composer 0.32.1 ``composer/loggers/mosaicml_logger.py`` (the constants, the
arguments, the disabled-without-``RUN_NAME`` behaviour).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

from cadence.loggers.logger_destination import LoggerDestination

__all__ = ["MOSAICML_ACCESS_TOKEN_ENV_VAR", "MOSAICML_PLATFORM_ENV_VAR", "MosaicMLLogger"]

log = logging.getLogger(__name__)

#: The run's name on the platform (set by the platform for every run).
RUN_NAME_ENV_VAR = "RUN_NAME"
#: ``"true"`` on the platform.
MOSAICML_PLATFORM_ENV_VAR = "MOSAICML_PLATFORM"
#: The file holding the platform's access token.
MOSAICML_ACCESS_TOKEN_ENV_VAR = "MOSAICML_ACCESS_TOKEN_FILE"
#: The folder the platform collects logs from.
MOSAICML_LOG_DIR_ENV_VAR = "MOSAICML_LOG_DIR"
#: The prefix of the platform's GPU log files.
MOSAICML_GPU_LOG_FILE_PREFIX_ENV_VAR = "MOSAICML_GPU_LOG_FILE_PREFIX"


def on_platform() -> bool:
    """Whether the MosaicML platform's variables are set: ``RUN_NAME``, or
    ``MOSAICML_PLATFORM`` = ``true`` (any case)."""
    return (os.environ.get(RUN_NAME_ENV_VAR) is not None
            or os.environ.get(MOSAICML_PLATFORM_ENV_VAR, "false").lower() == "true")


class MosaicMLLogger(LoggerDestination):
    """Composer's logger to the MosaicML platform, disabled: it logs nothing.

    Args:
        log_interval: seconds between Composer's metadata flushes (default 60); kept.
        ignore_keys: glob patterns of keys Composer would not send (default None); kept.
        ignore_exceptions: whether Composer would skip logging exceptions (default True);
            kept.

    Raises:
        RuntimeError: the platform's variables are set (``RUN_NAME`` or
            ``MOSAICML_PLATFORM=true``): the platform's client is not available in cadence,
            so the metadata would be lost. Unset them, or leave the logger out (llm-foundry
            adds it only when ``MOSAICML_PLATFORM`` is ``true``).
    """

    def __init__(self, log_interval: int = 60, ignore_keys: Optional[list[str]] = None,
                 ignore_exceptions: bool = True) -> None:
        if on_platform():
            raise RuntimeError(
                f"MosaicMLLogger: the MosaicML platform's variables are set "
                f"({RUN_NAME_ENV_VAR}={os.environ.get(RUN_NAME_ENV_VAR)!r}, "
                f"{MOSAICML_PLATFORM_ENV_VAR}={os.environ.get(MOSAICML_PLATFORM_ENV_VAR)!r}), "
                f"but the platform's client (mcli) is not available in cadence, so nothing "
                f"could be logged there. Unset {RUN_NAME_ENV_VAR} and "
                f"{MOSAICML_PLATFORM_ENV_VAR}, or leave MosaicMLLogger out and log with "
                f"another destination (MLFlowLogger, WandBLogger, FileLogger).")
        self.log_interval = log_interval
        self.ignore_keys = ignore_keys
        self.ignore_exceptions = ignore_exceptions
        self.run_name: Optional[str] = None
        self.buffered_metadata: dict[str, Any] = {}
        self._enabled = False
        log.warning(f"Environment variable `{RUN_NAME_ENV_VAR}` not set, so MosaicMLLogger is "
                    f"disabled as it is unable to identify which run to log to.")

    def log_metadata(self, metadata: dict[str, Any], force_flush: bool = False) -> None:
        """Composer buffers ``metadata`` for the platform; disabled, nothing is kept."""
        del metadata, force_flush

    def _flush_metadata(self, force_flush: bool = False, future: bool = True) -> None:
        """Composer sends the buffer to the platform; disabled, there is none."""
        del force_flush, future

    def log_hyperparameters(self, hyperparameters: Any) -> None:
        self.log_metadata(dict(hyperparameters))

    def log_metrics(self, metrics: Any, step: Optional[int] = None) -> None:
        self.log_metadata(dict(metrics))
