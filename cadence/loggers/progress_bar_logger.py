"""The :class:`ProgressBarLogger`: tqdm bars for training epochs and eval, on a terminal.

On a stream that is not a terminal use :class:`~cadence.loggers.ConsoleLogger`
instead (:func:`~cadence.loggers.default_progress_destination` chooses).

Source: MosaicML Composer's ``ProgressBarLogger`` (``composer/loggers/progress_bar_logger.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence, TextIO, Union

from tqdm import tqdm

from cadence.core.time import Time, TimeUnit
from cadence.utils.dist import get_global_rank
from cadence.loggers.console_logger import (
    ConsoleLogger,
    format_metrics,
    format_table,
    format_value,
    is_eval_metric,
    resolve_stream,
    total_epochs,
)
from cadence.loggers.logger_destination import to_python
from cadence.loggers.logger_destination import LoggerDestination
from cadence.registry import loggers

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
    """tqdm bars for training and for each evaluator, on rank zero only.

    As in Composer, when ``max_duration`` is in epochs (or unset) there is one training bar
    per epoch, counting its batches (total: the dataloader's length); otherwise one bar for
    the whole run, counting in ``max_duration``'s unit (batches, samples or tokens) up to
    it. The hyperparameters are printed once (YAML) above the bars at the first
    ``FIT_START``, ``EVAL_START`` or ``PREDICT_START``. The training bar shows the latest values it
    received through ``log_metrics``: ``loss`` (``loss/train/total``), ``lr`` (the first
    ``lr-*`` key, as :class:`~cadence.callbacks.LRMonitor` logs) and ``samples/s``
    (``throughput/samples_per_sec``, as :class:`~cadence.callbacks.SpeedMonitor` logs).
    Values are read (a host sync for device tensors) only when the bar is redrawn.

    Evaluator metrics (``metrics/<label>/...``) are written as a line above the bars.

    Args:
        stream: ``'stdout'``, ``'stderr'`` (looked up when a bar opens) or a text stream;
            default ``'stderr'`` (Composer's ``sys.stderr``).
        log_traces: print the algorithm traces handed to :meth:`log_traces` above the bars.
            Default False.
        dynamic_ncols: let the bar follow the terminal's width (cadence's).

    Raises:
        ValueError: an unknown ``stream`` string.
    """

    #: Shows the run's progress: a Trainer adds no default progress destination beside it.
    is_progress: bool = True

    def __init__(self, stream: Union[str, TextIO, None] = "stderr", log_traces: bool = False,
                 dynamic_ncols: bool = True) -> None:
        resolve_stream(stream)  # an unknown name fails now
        self._stream = stream
        self.should_log_traces = bool(log_traces)
        self.dynamic_ncols = dynamic_ncols
        self.hparams: dict[str, Any] = {}
        self.hparams_already_logged_to_console = False
        self._train_unit: Optional[TimeUnit] = None  # what the training bar counts
        self._train_bar: Optional[tqdm] = None
        self._eval_bar: Optional[tqdm] = None
        self._latest: dict[str, Any] = {}  # display name -> value (maybe a tensor)
        self._dirty = False
        self._eval_index = 0
        self._lr_key: Optional[str] = None

    @property
    def stream(self) -> TextIO:
        """Where bars are drawn (``'stdout'``/``'stderr'`` resolved now)."""
        return resolve_stream(self._stream)

    def _bar(self, total: Optional[int], desc: str, initial: int = 0, leave: bool = True,
             unit: str = "ba") -> tqdm:
        return tqdm(total=total, desc=desc, initial=initial, leave=leave, file=self.stream,
                    dynamic_ncols=self.dynamic_ncols, unit=unit)

    def _write(self, text: str) -> None:
        """A line above the bars (rank zero)."""
        if get_global_rank() == 0:
            tqdm.write(text, file=self.stream)

    def log_hyperparameters(self, hyperparameters: Mapping[str, Any]) -> None:
        """Keep the hyperparameters, printed once at the first fit, eval or predict."""
        self.hparams.update(hyperparameters)

    def log_traces(self, traces: Mapping[str, Any]) -> None:
        """Print algorithm traces (name -> trace) when ``log_traces`` is set."""
        if self.should_log_traces:
            for name, trace in traces.items():
                self._write(f"[trace]: {name}:{format_value(trace)}")

    def log_table(self, columns: Sequence[str], rows: Sequence[Sequence[Any]],
                  name: str = "Table", step: Optional[int] = None) -> None:
        """Print the table above the bars (rank zero), as the console logger does
        (:func:`~cadence.loggers.console_logger.format_table`)."""
        self._write(format_table(columns, rows, name, step))

    def _print_hparams(self) -> None:
        if self.hparams_already_logged_to_console:
            return
        self.hparams_already_logged_to_console = True
        if self.hparams:
            import yaml

            plain = {k: to_python(v) for k, v in self.hparams.items()}
            try:
                text = yaml.safe_dump(plain, sort_keys=False).rstrip()
            except yaml.YAMLError:
                text = "\n".join(f"{k}: {v!r}" for k, v in plain.items())
            self._write("\n".join(["*" * 30, "Config:", text, "*" * 30]))

    def fit_start(self, state: State, logger: Any) -> None:
        del state, logger
        self._print_hparams()

    def predict_start(self, state: State, logger: Any) -> None:
        del state, logger
        self._print_hparams()

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
            self._write(f"[eval][batch {step}] {format_metrics(evals)}")

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
        if get_global_rank() != 0 or self._train_bar is not None:
            return  # a bar over the whole run (max_duration not in epochs) stays open
        timestamp = state.timestamp
        max_duration = state.max_duration
        if max_duration is None or max_duration.unit == TimeUnit.EPOCH:
            self._train_unit = None  # one bar per epoch, counting its batches
            total = None if state.dataloader_len is None else int(state.dataloader_len)
            epochs = total_epochs(state)
            desc = f"epoch {int(timestamp.epoch) + 1}" + (f"/{epochs}" if epochs else "")
            self._train_bar = self._bar(total, desc, initial=int(timestamp.batch_in_epoch))
        else:
            self._train_unit = max_duration.unit
            unit = {TimeUnit.BATCH: "ba", TimeUnit.SAMPLE: "sp", TimeUnit.TOKEN: "tok"}.get(
                max_duration.unit, max_duration.unit.value)
            self._train_bar = self._bar(int(max_duration.value), "train",
                                        initial=int(timestamp.get(max_duration.unit)), unit=unit)

    def batch_end(self, state: State, logger: Any) -> None:
        del logger
        bar = self._train_bar
        if bar is None:
            return
        timestamp = state.timestamp
        done = int(timestamp.batch_in_epoch if self._train_unit is None
                   else timestamp.get(self._train_unit))
        if bar.total is not None and done > bar.total:
            bar.total = done  # a dataloader longer than announced: never overflow
        if self._dirty:
            bar.set_postfix(self._postfix(), refresh=False)
            self._dirty = False
        bar.update(max(0, done - bar.n))

    def epoch_end(self, state: State, logger: Any) -> None:
        del state, logger
        if self._train_unit is None:  # per-epoch bars close; a whole-run bar stays open
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
        self._print_hparams()
        if get_global_rank() != 0:
            return
        self._close_eval_bar()
        # State does not name the running evaluator; evaluators run in order.
        label, total = "eval", None
        if self._eval_index < len(state.evaluators):
            evaluator = state.evaluators[self._eval_index]
            label, total = evaluator.label, _safe_len(evaluator.dataloader.dataloader)
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
    progress_bar: bool, console_log_interval: Union[int, str, Time] = "10ba",
    stream: Union[str, TextIO, None] = "stderr", log_traces: bool = False,
) -> Optional[LoggerDestination]:
    """The destination that shows a run's progress on ``stream``.

    A tqdm :class:`ProgressBarLogger` when ``stream`` is a terminal; otherwise (CI logs,
    files, pipes, where a bar would write carriage returns) a :class:`ConsoleLogger` that
    prints a record every ``console_log_interval``. Both print on rank zero only.

    Args:
        progress_bar: whether to show progress at all; ``False`` gives ``None``.
        console_log_interval: the :class:`ConsoleLogger` interval (``"10ba"`` / ``"1ep"``;
            an ``int`` is epochs, as Composer reads it), used when ``stream`` is not a
            terminal.
        stream: ``'stdout'``, ``'stderr'`` (default) or a text stream.
        log_traces: passed to the destination.

    Returns:
        The destination to add to the run's loggers, or ``None``.

    Raises:
        ValueError: an unknown ``stream`` string.
    """
    if not progress_bar:
        return None
    try:
        on_terminal = bool(resolve_stream(stream).isatty())
    except (AttributeError, OSError):  # replaced, closed or detached stream
        on_terminal = False
    except ValueError:
        if isinstance(stream, str):
            raise
        on_terminal = False  # a closed stream
    if on_terminal:
        return ProgressBarLogger(stream=stream, log_traces=log_traces)
    return ConsoleLogger(log_interval=console_log_interval, stream=stream, log_traces=log_traces)
