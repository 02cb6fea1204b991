"""The :class:`Logger` that algorithms and callbacks log through, and the
:class:`LoggerDestination` base class that receives what they log.

Source: MosaicML Composer's ``Logger`` / ``LoggerDestination`` (``composer/loggers``).
"""

from __future__ import annotations

import pathlib
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence, Union

import torch

from cadence.trainer.core.callback import Callback

if TYPE_CHECKING:
    from cadence.trainer.core.state import State

__all__ = ["Logger", "LoggerDestination", "to_python"]


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


class Logger:
    """Fans logged metrics out to every :class:`LoggerDestination`.

    Args:
        state: the run's State; ``step`` defaults to ``state.timestamp.batch``.
        destinations: where metrics go.
    """

    def __init__(self, state: State, destinations: Sequence[LoggerDestination] = ()) -> None:
        self._state = state
        self.destinations = list(destinations)

    def log_metrics(self, metrics: Mapping[str, Any], step: Optional[int] = None) -> None:
        """Log ``metrics`` (keys like ``loss/train/total``, ``metrics/eval/LanguagePerplexity``)."""
        if not self.destinations:
            return
        step = int(self._state.timestamp.batch if step is None else step)  # a Time too
        for destination in self.destinations:
            destination.log_metrics(metrics, step)

    def log_hyperparameters(self, hyperparameters: Mapping[str, Any]) -> None:
        """Log the run's hyperparameters (e.g. the whole YAML config) once."""
        for destination in self.destinations:
            destination.log_hyperparameters(hyperparameters)

    def log_table(self, columns: Sequence[str], rows: Sequence[Sequence[Any]],
                  name: str = "Table", step: Optional[int] = None) -> None:
        """Log a table to every destination; ``step`` defaults to ``state.timestamp.batch``."""
        step = int(self._state.timestamp.batch if step is None else step)  # a Time too
        for destination in self.destinations:
            destination.log_table(columns, rows, name, step)

    def upload_file(self, remote_file_name: str, file_path: Union[pathlib.Path, str], *,
                    overwrite: bool = False) -> None:
        """Hand the local file ``file_path`` to every destination that stores files, under
        ``remote_file_name``. Both may hold ``{run_name}``, ``{rank}``, ``{local_rank}``,
        ``{world_size}``, ``{node_rank}`` (filled in here, as Composer does).

        Raises:
            ValueError: a placeholder other than those.
        """
        from cadence.trainer.dist import (
            get_global_rank, get_local_rank, get_node_rank, get_world_size,
        )

        values = {"run_name": self._state.run_name, "rank": get_global_rank(),
                  "local_rank": get_local_rank(), "world_size": get_world_size(),
                  "node_rank": get_node_rank()}
        try:
            remote = remote_file_name.format(**values)
            local = pathlib.Path(str(file_path).format(**values))
        except (KeyError, IndexError) as exc:
            raise ValueError(f"upload_file: unknown placeholder {exc} in {remote_file_name!r} "
                             f"or {str(file_path)!r}; known: {sorted(values)}.") from None
        for destination in self.destinations:
            destination.upload_file(self._state, remote, local, overwrite=overwrite)

    def has_file_upload_destination(self) -> bool:
        """Whether any destination stores files (:meth:`LoggerDestination.can_upload_files`)."""
        return any(destination.can_upload_files() for destination in self.destinations)
