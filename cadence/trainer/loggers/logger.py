"""The :class:`Logger` that algorithms and callbacks log through, and the
:class:`LoggerDestination` base class that receives what they log.

Source: MosaicML Composer's ``Logger`` / ``LoggerDestination`` (``composer/loggers``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

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
        step = self._state.timestamp.batch if step is None else step
        for destination in self.destinations:
            destination.log_metrics(metrics, step)

    def log_hyperparameters(self, hyperparameters: Mapping[str, Any]) -> None:
        """Log the run's hyperparameters (e.g. the whole YAML config) once."""
        for destination in self.destinations:
            destination.log_hyperparameters(hyperparameters)
