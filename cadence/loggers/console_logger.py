"""The :class:`ConsoleLogger`: plain metric records on a stream, for logs that are not a
terminal (CI, SLURM, ``| tee``), where a progress bar would write carriage returns; with
Composer's interval, fit-end and eval-progress rules.

Source: MosaicML Composer's ``ConsoleLogger`` (``composer/loggers/console_logger.py``).
"""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence, TextIO, Union

from cadence.core.time import Time, TimeUnit
from cadence.utils.dist import get_global_rank, get_local_rank
from cadence.loggers.logger_destination import LoggerDestination, to_python
from cadence.registry import loggers

if TYPE_CHECKING:
    from cadence.core.state import State

__all__ = ["ConsoleLogger", "NUM_EVAL_LOGGING_EVENTS", "eval_progress_batches", "format_table",
           "format_value", "format_metrics", "is_eval_metric", "progress_string", "resolve_stream",
           "total_batches", "total_epochs"]

#: Eval progress lines per evaluator run: at 0 %, 10 %, ... 100 % of its batches (Composer's).
NUM_EVAL_LOGGING_EVENTS = 11


def format_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], name: str,
                 step: Optional[int] = None) -> str:
    """A table as console lines: ``[table] name (step N):``, then one line per row of
    ``column: value`` pairs (:func:`format_value`) separated by `` | ``."""
    lines = [f"[table] {name}" + ("" if step is None else f" (step {step})") + ":"]
    lines += ["\t " + " | ".join(f"{c}: {format_value(v)}" for c, v in zip(columns, row))
              for row in rows]
    return "\n".join(lines)


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



def resolve_stream(stream: Union[str, TextIO, None], argument: str = "stream") -> TextIO:
    """``stream`` as a text stream: ``'stdout'`` / ``'stderr'`` (any case) are looked up now
    (so a replaced ``sys.stdout`` is honoured), a stream is itself, None is ``sys.stdout``.

    Raises:
        ValueError: any other string, naming ``argument``.
    """
    if stream is None:
        return sys.stdout
    if isinstance(stream, str):
        if stream.lower() == "stdout":
            return sys.stdout
        if stream.lower() == "stderr":
            return sys.stderr
        raise ValueError(f"{argument} must be 'stdout', 'stderr' or a text stream, got "
                         f"{stream!r}.")
    return stream


def progress_string(state: State) -> str:
    """Where training is, as Composer prints it: ``[epoch=1][batch=2/4]`` when
    ``max_duration`` is in epochs (the epoch 1-based; right after an epoch ends, that epoch
    and its last batch), else ``[batch=5/8]`` (or ``[sample=..]``, ``[token=..]``, in
    ``max_duration``'s unit); empty without ``max_duration``."""
    max_duration = state.max_duration
    if max_duration is None:
        return ""
    timestamp = state.timestamp
    if max_duration.unit == TimeUnit.EPOCH:
        batch, epoch = int(timestamp.batch_in_epoch), int(timestamp.epoch)
        if batch == 0 and epoch != 0:  # between EPOCH_END and the next EPOCH_START
            epoch -= 1
            batch = int(state.dataloader_len) if state.dataloader_len is not None else batch
        total = "" if state.dataloader_len is None else f"/{int(state.dataloader_len)}"
        return f"[epoch={epoch + 1}][batch={batch}{total}]"
    unit = max_duration.unit
    return f"[{unit.name.lower()}={int(timestamp.get(unit))}/{max_duration.value}]"


def eval_progress_batches(total: int) -> list[int]:
    """The eval batches (1-based) after which a progress line is printed: every batch when
    there are fewer than :data:`NUM_EVAL_LOGGING_EVENTS`, else the 0 %, 10 %, ... 90 %
    points (linear interpolation over ``1..total``, rounded half to even, as NumPy's
    ``quantile().round()``); never the last batch, whose line ``EVAL_END`` prints."""
    if total < NUM_EVAL_LOGGING_EVENTS:
        points = list(range(1, total + 1))
    else:
        steps = NUM_EVAL_LOGGING_EVENTS - 1
        points = [round(1 + (total - 1) * k / steps) for k in range(NUM_EVAL_LOGGING_EVENTS)]
    return [p for p in points if p != total]


@loggers.register("console")
class ConsoleLogger(LoggerDestination):
    """Prints metrics as plain text, Composer's format and rules, on rank zero only::

        [epoch=1][batch=10/560]:
        \t Train loss/train/total: 5.1234
        \t Train lr-AdamW/group0: 3.0000e-03
        [Eval batch=1/40] Eval on eval data
        ...
        [Eval batch=40/40] Eval on eval data:
        \t Eval metrics/eval/LanguagePerplexity: 123.4500

    What is logged is gathered (latest value per key) and printed as one record:

    - at ``BATCH_END`` when ``log_interval`` is in batches and the batch count is a multiple
      of it, or nothing was printed yet (so the first batch always is);
    - at ``EPOCH_END`` when it is in epochs and the epoch count is a multiple, or nothing
      was printed yet;
    - at ``FIT_END``, unless the last batch was just printed.

    ``EVAL_START`` drops what was gathered and not printed (as Composer does); during eval a
    progress line is printed at 0 %, 10 %, ... of the evaluator's batches
    (:func:`eval_progress_batches`), and ``EVAL_END`` prints the evaluator's metrics. The
    hyperparameters are printed once (YAML, between lines of ``*``) at the first
    ``FIT_START``, ``EVAL_START`` or ``PREDICT_START``. A record with nothing gathered is not
    printed (the Trainer logs the loss every ``log_interval`` and at this logger's
    ``log_interval``, by the rule of :func:`~cadence.utils.misc.interval_crossed`, not every
    batch). Values print
    with :func:`format_value`. No carriage returns are written.

    Args:
        log_interval: how often to print training records: a :class:`~cadence.Time` or time
            string in ``ba`` or ``ep`` (``"10ba"``, ``"1ep"``), or an ``int`` (epochs, as in
            Composer). Default ``'1ba'``.
        stream: ``'stdout'``, ``'stderr'`` (looked up at write time) or a text stream.
            Default ``'stderr'`` (Composer's ``sys.stderr``).
        log_traces: print the algorithm traces handed to :meth:`log_traces`. Default False.

    Raises:
        ValueError: ``log_interval`` not positive or in another unit; an unknown ``stream``
            string.
    """

    #: Shows the run's progress: a Trainer adds no default progress destination beside it.
    is_progress: bool = True

    def __init__(self, log_interval: Union[int, str, Time] = "1ba",
                 stream: Union[str, TextIO, None] = "stderr", log_traces: bool = False) -> None:
        try:
            interval = Time.from_input(log_interval, TimeUnit.EPOCH)
        except (TypeError, ValueError):
            interval = None
        if interval is None or interval.unit not in (TimeUnit.BATCH, TimeUnit.EPOCH) \
                or interval.value < 1:
            raise ValueError(
                f"ConsoleLogger log_interval (the Trainer's console_log_interval) must be a "
                f"positive number of batches or epochs (e.g. '10ba', '1ep', or an int: "
                f"epochs); got {log_interval!r}.")
        resolve_stream(stream)  # an unknown name fails now
        self.log_interval = interval
        self._stream = stream
        self.should_log_traces = bool(log_traces)
        self.hparams: dict[str, Any] = {}
        self.hparams_already_logged_to_console = False
        self.logged_metrics: dict[str, Any] = {}
        self.last_logged_batch = 0
        self.eval_batch_idxs_to_log: list[int] = []

    # -- writing --------------------------------------------------------------------------
    @property
    def stream(self) -> TextIO:
        """Where lines go (``'stdout'``/``'stderr'`` resolved now)."""
        return resolve_stream(self._stream)

    def _log_to_console(self, text: str) -> None:
        if get_global_rank() == 0:
            print(text, file=self.stream, flush=True)

    def _record(self, header: str, prefix: str, data: Mapping[str, Any]) -> None:
        ordered = dict(sorted(data.items(), key=lambda item: _key_rank(item[0])))
        lines = [header + (":" if ordered else "")]
        lines += [f"\t {prefix}{key}: {format_value(value)}" for key, value in ordered.items()]
        self._log_to_console("\n".join(lines))

    def _print_train(self, state: State) -> None:
        if self.logged_metrics:
            self._record(progress_string(state), "Train ", self.logged_metrics)
        self.logged_metrics = {}
        self.last_logged_batch = int(state.timestamp.batch)

    def _print_hparams(self) -> None:
        if self.hparams_already_logged_to_console:
            return
        self.hparams_already_logged_to_console = True
        if get_local_rank() == 0 and self.hparams:
            import yaml

            plain = {k: to_python(v) for k, v in self.hparams.items()}
            try:
                text = yaml.safe_dump(plain, sort_keys=False).rstrip()
            except yaml.YAMLError:
                text = "\n".join(f"{k}: {v!r}" for k, v in plain.items())
            self._log_to_console("\n".join(["*" * 30, "Config:", text, "*" * 30]))

    # -- LoggerDestination ----------------------------------------------------------------
    def log_metrics(self, metrics: Mapping[str, Any], step: Optional[int] = None) -> None:
        """Gather ``metrics`` for the next record (values read when printed)."""
        del step
        self.logged_metrics.update(metrics)

    def log_hyperparameters(self, hyperparameters: Mapping[str, Any]) -> None:
        """Keep the hyperparameters, printed once at the first fit, eval or predict."""
        self.hparams.update(hyperparameters)

    def log_table(self, columns: Sequence[str], rows: Sequence[Sequence[Any]],
                  name: str = "Table", step: Optional[int] = None) -> None:
        """Print the table now (rank zero): :func:`format_table`'s lines."""
        self._log_to_console(format_table(columns, rows, name, step))

    def log_traces(self, traces: Mapping[str, Any]) -> None:
        """Print algorithm traces (name -> trace) when ``log_traces`` is set."""
        if self.should_log_traces:
            for name, trace in traces.items():
                self._log_to_console(f"[trace]: {name}:{format_value(trace)}")

    # -- events ---------------------------------------------------------------------------
    def fit_start(self, state: State, logger: Any) -> None:
        del state, logger
        self._print_hparams()

    def predict_start(self, state: State, logger: Any) -> None:
        del state, logger
        self._print_hparams()

    def batch_end(self, state: State, logger: Any) -> None:
        del logger
        if self.log_interval.unit == TimeUnit.BATCH and (
                int(state.timestamp.batch) % int(self.log_interval.value) == 0
                or self.last_logged_batch == 0):
            self._print_train(state)

    def epoch_end(self, state: State, logger: Any) -> None:
        del logger
        if self.log_interval.unit == TimeUnit.EPOCH and (
                int(state.timestamp.epoch) % int(self.log_interval.value) == 0
                or self.last_logged_batch == 0):
            self._print_train(state)

    def fit_end(self, state: State, logger: Any) -> None:
        del logger
        if self.last_logged_batch != int(state.timestamp.batch):
            self._print_train(state)  # what the last interval left over
        self.logged_metrics = {}

    def eval_start(self, state: State, logger: Any) -> None:
        del logger
        self.logged_metrics = {}  # Composer: training values not printed yet are dropped
        self.eval_batch_idxs_to_log = eval_progress_batches(self._eval_total(state))
        self._print_hparams()

    def eval_batch_end(self, state: State, logger: Any) -> None:
        del logger
        if int(state.eval_timestamp.batch) in self.eval_batch_idxs_to_log:
            self._log_to_console(self._eval_progress(state))

    def eval_end(self, state: State, logger: Any) -> None:
        del logger
        self._record(self._eval_progress(state), "Eval ", self.logged_metrics)
        self.logged_metrics = {}

    def _eval_progress(self, state: State) -> str:
        return (f"[Eval batch={int(state.eval_timestamp.batch)}/{self._eval_total(state)}] "
                f"Eval on {state.dataloader_label} data")

    @staticmethod
    def _eval_total(state: State) -> int:
        """Batches the running evaluator reads: its dataloader's length, or its
        ``subset_num_batches`` when smaller; 0 when neither is known."""
        total = None if state.dataloader_len is None else int(state.dataloader_len)
        evaluator = next((e for e in state.evaluators if e.label == state.dataloader_label), None)
        subset = getattr(evaluator, "subset_num_batches", None)
        if subset is not None and int(subset) >= 0:
            total = int(subset) if total is None else min(total, int(subset))
        return total or 0

    def close(self) -> None:
        """Drop gathered metrics (nothing to release). Safe to call twice."""
        self.logged_metrics = {}
