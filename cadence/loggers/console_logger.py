"""The :class:`ConsoleLogger`: plain one-line metric records on stdout, for logs that are
not a terminal (CI, SLURM, ``| tee``), where a progress bar would write carriage returns.

Source: MosaicML Composer's ``ConsoleLogger`` (``composer/loggers/console_logger.py``).
"""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, Any, Mapping, Optional, TextIO, Union

from cadence.core.time import Time, Timestamp, TimeUnit
from cadence.utils.dist import get_global_rank
from cadence.loggers.logger_destination import LoggerDestination, to_python
from cadence.config.registry import loggers

if TYPE_CHECKING:
    from cadence.core.state import State

__all__ = ["ConsoleLogger", "format_value", "format_metrics", "is_eval_metric", "run_position",
           "total_batches", "total_epochs"]


def format_value(value: Any) -> str:
    """A logged value as short readable text.

    Floats print with 4 decimals (``5.1234``), or in scientific notation when small or large
    (``3.0000e-03``); non-finite floats print as ``nan``/``inf``/``-inf``; anything else
    uses ``str``. 0-d tensors are read here (a host sync, at write time).
    """
    value = to_python(value)
    if isinstance(value, bool) or isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value == 0.0:
            return "0.0"
        if abs(value) < 1e-2 or abs(value) >= 1e6:
            return f"{value:.4e}"
        return f"{value:.4f}"
    return str(value)


def format_metrics(metrics: Mapping[str, Any]) -> str:
    """``key: value, key: value`` in the order given (see :func:`format_value`)."""
    return ", ".join(f"{key}: {format_value(value)}" for key, value in metrics.items())


_KEY_ORDER = ("loss/", "lr-", "throughput/samples_per_sec", "throughput/", "metrics/")


def _key_rank(key: str) -> int:
    for rank, prefix in enumerate(_KEY_ORDER):
        if key.startswith(prefix):
            return rank
    return len(_KEY_ORDER)


def is_eval_metric(key: str) -> bool:
    """Whether ``key`` is an evaluator's metric: ``metrics/<label>/<Name>``, label not ``train``."""
    return key.startswith("metrics/") and not key.startswith("metrics/train/")


def total_batches(state: State) -> Optional[int]:
    """The run's length in batches, when ``max_duration`` and the dataloader length tell it."""
    max_duration = state.max_duration
    if max_duration is None:
        return None
    if max_duration.unit == TimeUnit.BATCH:
        return int(max_duration.value)
    if max_duration.unit == TimeUnit.EPOCH and state.dataloader_len:
        return int(max_duration.value) * int(state.dataloader_len)
    return None


def total_epochs(state: State) -> Optional[int]:
    """The run's length in epochs, when ``max_duration`` and the dataloader length tell it."""
    max_duration = state.max_duration
    if max_duration is None:
        return None
    if max_duration.unit == TimeUnit.EPOCH:
        return int(max_duration.value)
    if max_duration.unit == TimeUnit.BATCH and state.dataloader_len:
        return -(-int(max_duration.value) // int(state.dataloader_len))
    return None


def run_position(state: State, timestamp: Optional[Timestamp] = None) -> str:
    """Where a training run is, as ``[epoch 1/2][batch 40/560]``.

    The epoch is 1-based (the epoch in progress, or the one that just ended when every batch
    of it is done); the batch is the global optimizer step (the ``step`` metrics are logged
    at). Totals are left out when ``max_duration`` does not give them.

    Args:
        state: gives ``max_duration`` and ``dataloader_len`` (for the totals).
        timestamp: the position to show; default ``state.timestamp``.
    """
    timestamp = state.timestamp if timestamp is None else timestamp
    epoch = int(timestamp.epoch) + 1
    if timestamp.batch_in_epoch == 0 and timestamp.epoch > 0:
        epoch = int(timestamp.epoch)  # between EPOCH_END and the next EPOCH_START
    epochs = total_epochs(state)
    batches = total_batches(state)
    epoch_text = f"{epoch}/{epochs}" if epochs else f"{epoch}"
    batch_text = f"{int(timestamp.batch)}/{batches}" if batches else f"{int(timestamp.batch)}"
    return f"[epoch {epoch_text}][batch {batch_text}]"


@loggers.register("console")
class ConsoleLogger(LoggerDestination):
    """Prints metrics as plain one-line records, on rank zero only, flushing each line.

    Training metrics are gathered (latest value per key) and printed once per
    ``log_interval``, losses first, then learning rates and throughput::

        [epoch 1/2][batch 40/560] loss/train/total: 5.1234, lr-AdamW/group0: 3.0000e-03

    A record for step ``s`` is printed once every metric of that step has arrived: when a
    later step begins (``BATCH_START``), at ``EPOCH_END``, before eval output, or at
    ``FIT_END``, so it does not matter whether a metric is logged before or after the
    ``BATCH_END`` callbacks. Evaluator metrics (``metrics/<label>/...``, label not ``train``)
    are printed as soon as they are logged, whatever the interval::

        [eval][batch 560] metrics/eval/LanguagePerplexity: 123.4500

    Hyperparameters are not printed. No carriage returns are written.

    Args:
        log_interval: how often to print training metrics: an ``int`` (batches) or a time
            string in ``ba`` or ``ep`` (``"10ba"``, ``"1ep"``). Default 10 batches.
        stream: where to write; default ``sys.stdout`` (looked up at write time).

    Raises:
        ValueError: ``log_interval`` is not positive or is in another unit.
    """

    #: Shows the run's progress: a Trainer adds no default progress destination beside it.
    is_progress: bool = True

    def __init__(self, log_interval: Union[int, str, Time] = 10,
                 stream: Optional[TextIO] = None) -> None:
        interval = Time.from_input(log_interval, TimeUnit.BATCH)
        if interval.unit not in (TimeUnit.BATCH, TimeUnit.EPOCH) or interval.value < 1:
            raise ValueError(
                f"ConsoleLogger log_interval must be a positive number of batches or epochs "
                f"(e.g. 10, '10ba', '1ep'); got {log_interval!r}."
            )
        self.log_interval = interval
        self._stream = stream
        self._state: Optional[State] = None
        self._pending: dict[str, Any] = {}
        self._pending_step: Optional[int] = None
        self._last_batch_end: Optional[Timestamp] = None  # the timestamp at the last BATCH_END
        self._last_printed_step: Optional[int] = None

    # -- writing --------------------------------------------------------------------------
    @property
    def stream(self) -> TextIO:
        """Where lines go (``sys.stdout`` unless a stream was given)."""
        return self._stream if self._stream is not None else sys.stdout

    def _print(self, line: str) -> None:
        print(line, file=self.stream, flush=True)

    def _due(self, step: Optional[int]) -> bool:
        if self.log_interval.unit != TimeUnit.BATCH or step is None:
            return False
        # The first step is always printed, so a run shows where its loss started.
        return step == 1 or step % int(self.log_interval.value) == 0

    def _print_pending(self) -> None:
        if not self._pending:
            return
        last = self._last_batch_end
        if self._state is not None and last is not None and last.batch == self._pending_step:
            position = run_position(self._state, last)
        else:
            position = f"[batch {self._pending_step}]"
        # Losses first, then learning rates, throughput, metrics and the rest (stable order).
        ordered = dict(sorted(self._pending.items(), key=lambda item: _key_rank(item[0])))
        self._print(f"{position} {format_metrics(ordered)}")
        self._last_printed_step = self._pending_step
        self._pending = {}

    def _flush_if_due(self) -> None:
        if self._pending and self._due(self._pending_step):
            self._print_pending()

    # -- LoggerDestination ----------------------------------------------------------------
    def log_metrics(self, metrics: Mapping[str, Any], step: Optional[int] = None) -> None:
        """Gather training metrics for the interval's record; print eval metrics at once."""
        if get_global_rank() != 0:
            return
        train = {k: v for k, v in metrics.items() if not is_eval_metric(k)}
        evals = {k: v for k, v in metrics.items() if is_eval_metric(k)}
        if train:
            if step != self._pending_step:
                self._flush_if_due()  # the previous step is complete
                self._pending_step = step
            self._pending.update(train)
        if evals:
            self._flush_if_due()
            batch = step if step is not None else (
                int(self._state.timestamp.batch) if self._state is not None else "?")
            self._print(f"[eval][batch {batch}] {format_metrics(evals)}")

    # -- events ---------------------------------------------------------------------------
    def init(self, state: State, logger: Any) -> None:
        del logger
        self._state = state

    def fit_start(self, state: State, logger: Any) -> None:
        del logger
        self._state = state

    def batch_start(self, state: State, logger: Any) -> None:
        del state, logger
        self._flush_if_due()

    def batch_end(self, state: State, logger: Any) -> None:
        del logger
        self._state = state
        self._last_batch_end = state.timestamp

    def epoch_end(self, state: State, logger: Any) -> None:
        del logger
        if self.log_interval.unit == TimeUnit.EPOCH:
            timestamp = state.timestamp
            # Epochs done, whether or not the trainer advanced the epoch before EPOCH_END.
            done = int(timestamp.epoch) + (0 if timestamp.batch_in_epoch == 0 else 1)
            if self._pending and done % int(self.log_interval.value) == 0:
                self._print_pending()
        else:
            self._flush_if_due()

    def eval_before_all(self, state: State, logger: Any) -> None:
        del state, logger
        self._flush_if_due()

    def fit_end(self, state: State, logger: Any) -> None:
        del logger
        # Print what the last interval left over, unless the last step was just printed.
        if self._pending and self._last_printed_step != state.timestamp.batch:
            self._print_pending()
        self._pending = {}
        self._pending_step = None

    def close(self) -> None:
        """Drop gathered metrics (nothing to release). Safe to call twice."""
        self._pending = {}
        self._pending_step = None
