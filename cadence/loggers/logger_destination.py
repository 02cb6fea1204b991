"""The :class:`LoggerDestination` base class: where logged metrics go (a file, the console,
wandb, ...).

Source: MosaicML Composer's ``LoggerDestination`` (``composer/loggers/logger_destination.py``).
"""

from __future__ import annotations

import pathlib
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

import torch

from cadence.core.callback import Callback

if TYPE_CHECKING:
    from cadence.core.state import State

__all__ = ["LoggerDestination", "to_python"]


def to_python(value: Any) -> Any:
    """A logged value as a plain Python number (tensors read here, at write time, not at log
    time, so logging a device tensor costs no host sync until a destination writes it)."""
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    return value


class LoggerDestination(Callback):
    """Where logged metrics go (a file, the console, wandb). It is a :class:`Callback` too,
    so it sees every event (e.g. to draw a progress bar).

    Values may be 0-d tensors; call :func:`to_python` when writing them.
    """

    def log_metrics(self, metrics: Mapping[str, Any], step: Optional[int] = None) -> None:
        """Receive ``metrics`` (name -> number or 0-d tensor) at optimizer step ``step``."""
        del metrics, step

    def log_hyperparameters(self, hyperparameters: Mapping[str, Any]) -> None:
        """Receive the run's configuration and other hyperparameters once."""
        del hyperparameters

    def log_table(self, columns: Sequence[str], rows: Sequence[Sequence[Any]],
                  name: str = "Table", step: Optional[int] = None) -> None:
        """Receive a table (``rows`` of values under ``columns``); default: ignore it."""
        del columns, rows, name, step

    def can_upload_files(self) -> bool:
        """Whether :meth:`upload_file` stores files somewhere (default False)."""
        return False

    def upload_file(self, state: State, remote_file_name: str,
                    file_path: pathlib.Path, *, overwrite: bool) -> None:
        """Store the local file ``file_path`` under ``remote_file_name`` (an object store, a
        run's artifacts); default: ignore it. Composer's signature.

        The file may change or disappear once this returns: copy it first if the upload
        happens in the background.
        """
        del state, remote_file_name, file_path, overwrite
