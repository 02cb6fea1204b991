"""The :class:`ProgressBarLogger`: tqdm bars for training epochs and eval, on a terminal.

On a stream that is not a terminal use :class:`~cadence.loggers.ConsoleLogger`
instead (:func:`~cadence.loggers.default_progress_destination` chooses).

Source: MosaicML Composer's ``ProgressBarLogger`` (``composer/loggers/progress_bar_logger.py``).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Mapping, Optional, TextIO, Union

from tqdm import tqdm

from cadence.core.time import Time, TimeUnit
from cadence.utils.dist import get_global_rank
from cadence.loggers.console_logger import (
    ConsoleLogger,
    format_metrics,
    format_value,
    is_eval_metric,
    total_epochs,
)
from cadence.loggers.logger_destination import LoggerDestination
from cadence.config.registry import loggers

if TYPE_CHECKING:
    from cadence.core.state import State

__all__ = ["ProgressBarLogger", "default_progress_destination"]

_LOSS_KEY = "loss/train/total"
_THROUGHPUT_KEY = "throughput/samples_per_sec"


def _safe_len(obj: Any) -> Optional[int]:
    try:
        return len(obj)
    except TypeError:
        return None


@loggers.register("progress_bar")
class ProgressBarLogger(LoggerDestination):
    """One tqdm bar per training epoch and one per evaluator, on rank zero only.

    The training bar counts batches (total: the dataloader's length, or the batches left
    when ``max_duration`` is in batches and ends sooner) and shows the latest values it
    received through ``log_metrics``: ``loss`` (``loss/train/total``), ``lr`` (the first
    ``lr-*`` key, as :class:`~cadence.callbacks.LRMonitor` logs) and ``samples/s``
    (``throughput/samples_per_sec``, as :class:`~cadence.callbacks.SpeedMonitor` logs).
    Values are read (a host sync for device tensors) only when the bar is redrawn.

    Evaluator metrics (``metrics/<label>/...``) are written as a line above the bars.

    Args:
        stream: where to draw; default ``sys.stdout`` (looked up when a bar opens).
        dynamic_ncols: let the bar follow the terminal's width.
    """

    #: Shows the run's progress: a Trainer adds no default progress destination beside it.
    is_progress: bool = True

    def __init__(self, stream: Optional[TextIO] = None, dynamic_ncols: bool = True) -> None:
        self._stream = stream
        self.dynamic_ncols = dynamic_ncols
        self._train_bar: Optional[tqdm] = None
        self._eval_bar: Optional[tqdm] = None
        self._latest: dict[str, Any] = {}  # display name -> value (maybe a tensor)
        self._dirty = False
        self._eval_index = 0
        self._lr_key: Optional[str] = None

    @property
    def stream(self) -> TextIO:
        """Where bars are drawn (``sys.stdout`` unless a stream was given)."""
        return self._stream if self._stream is not None else sys.stdout

    def _bar(self, total: Optional[int], desc: str, initial: int = 0, leave: bool = True) -> tqdm:
        return tqdm(total=total, desc=desc, initial=initial, leave=leave, file=self.stream,
                    dynamic_ncols=self.dynamic_ncols, unit="ba")

    # -- LoggerDestination ----------------------------------------------------------------
    def log_metrics(self, metrics: Mapping[str, Any], step: Optional[int] = None) -> None:
        """Keep the latest loss, lr and throughput for the bar; print eval metrics."""
        if get_global_rank() != 0:
            return
        evals = {}
        for key, value in metrics.items():
            if key == _LOSS_KEY:
                self._latest["loss"] = value
            elif key.startswith("lr-") and self._lr_key in (None, key):
                self._lr_key = key  # the first learning rate seen (optimizer 0, group 0)
                self._latest["lr"] = value
            elif key == _THROUGHPUT_KEY:
                self._latest["samples/s"] = value
            elif is_eval_metric(key):
                evals[key] = value
            else:
                continue
            self._dirty = True
        if evals:
            tqdm.write(f"[eval][batch {step}] {format_metrics(evals)}", file=self.stream)

    def _postfix(self) -> dict[str, str]:
        postfix = {}
        for name, value in self._latest.items():
            text = format_value(value)
            if name == "samples/s":
                try:
                    text = f"{float(text):.1f}"
                except ValueError:
                    pass
            postfix[name] = text
        return postfix

    # -- training -------------------------------------------------------------------------
    def epoch_start(self, state: State, logger: Any) -> None:
        del logger
        if get_global_rank() != 0:
            return
        self._close_train_bar()
        timestamp = state.timestamp
        total = None if state.dataloader_len is None else int(state.dataloader_len)
        max_duration = state.max_duration
        if max_duration is not None and max_duration.unit == TimeUnit.BATCH:
            left = int(max_duration.value) - int(timestamp.batch) + int(timestamp.batch_in_epoch)
            total = left if total is None else min(total, left)
        epochs = total_epochs(state)
        desc = f"epoch {int(timestamp.epoch) + 1}" + (f"/{epochs}" if epochs else "")
        self._train_bar = self._bar(total, desc, initial=int(timestamp.batch_in_epoch))

    def batch_end(self, state: State, logger: Any) -> None:
        del state, logger
        bar = self._train_bar
        if bar is None:
            return
        if bar.total is not None and bar.n + 1 > bar.total:
            bar.total = bar.n + 1  # a dataloader longer than announced: never overflow
        if self._dirty:
            bar.set_postfix(self._postfix(), refresh=False)
            self._dirty = False
        bar.update(1)

    def epoch_end(self, state: State, logger: Any) -> None:
        del state, logger
        self._close_train_bar()

    def fit_end(self, state: State, logger: Any) -> None:
        del state, logger
        self._close_train_bar()

    def _close_train_bar(self) -> None:
        if self._train_bar is not None:
            if self._dirty:
                self._train_bar.set_postfix(self._postfix(), refresh=False)
                self._dirty = False
            self._train_bar.close()
            self._train_bar = None

    # -- eval -----------------------------------------------------------------------------
    def eval_before_all(self, state: State, logger: Any) -> None:
        del state, logger
        self._eval_index = 0

    def eval_start(self, state: State, logger: Any) -> None:
        del logger
        if get_global_rank() != 0:
            return
        self._close_eval_bar()
        # State does not name the running evaluator; evaluators run in order.
        label, total = "eval", None
        if self._eval_index < len(state.evaluators):
            evaluator = state.evaluators[self._eval_index]
            label, total = evaluator.label, _safe_len(evaluator.dataloader)
        self._eval_index += 1
        self._eval_bar = self._bar(total, label, leave=False)

    def eval_batch_end(self, state: State, logger: Any) -> None:
        del state, logger
        bar = self._eval_bar
        if bar is None:
            return
        if bar.total is not None and bar.n + 1 > bar.total:
            bar.total = bar.n + 1
        bar.update(1)

    def eval_end(self, state: State, logger: Any) -> None:
        del state, logger
        self._close_eval_bar()

    def _close_eval_bar(self) -> None:
        if self._eval_bar is not None:
            self._eval_bar.close()
            self._eval_bar = None

    def close(self) -> None:
        """Close any open bar. Safe to call twice."""
        self._close_eval_bar()
        self._close_train_bar()


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
