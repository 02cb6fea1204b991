"""The :class:`TensorboardLogger`: scalars, hyperparameters, tables (as Markdown text) and
images to TensorBoard event files.

Source: MosaicML Composer's ``TensorboardLogger`` (``composer/loggers/tensorboard_logger.py``):
its arguments (``log_dir``, ``flush_interval``, ``rank_zero_only``) and flush points; the
hyperparameters are written once into the run's own event file (as Lightning's
``TensorBoardLogger`` does) instead of a new sub-run per evaluation. Needs the
``tensorboard`` package (``pip install 'cadence[tensorboard]'``); the writer is
``torch.utils.tensorboard.SummaryWriter``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from cadence.utils.dist import get_global_rank
from cadence.loggers.logger_destination import image_batch, mask_batch, to_python
from cadence.loggers.tracker_destination import TrackerDestination, flatten_hyperparameters
from cadence.registry import loggers

if TYPE_CHECKING:
    from cadence.core.state import State

__all__ = ["TensorboardLogger", "TensorBoardLogger", "markdown_table"]


def _cell(value: Any) -> str:
    text = str(to_python(value))
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\r\n", "<br>") \
        .replace("\n", "<br>")


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """``columns`` and ``rows`` as a GitHub-flavoured Markdown table (what TensorBoard's
    text plugin renders): a header row, a ``---`` rule, one line per row; ``|`` escaped,
    line breaks as ``<br>``.

    Raises:
        ValueError: a row's length differs from ``len(columns)``.
    """
    lines = ["| " + " | ".join(_cell(c) for c in columns) + " |",
             "|" + "---|" * len(columns)]
    for index, row in enumerate(rows):
        if len(row) != len(columns):
            raise ValueError(f"Table row {index} has {len(row)} values for {len(columns)} "
                             f"columns {list(columns)}.")
        lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
    return "\n".join(lines)


@loggers.register("tensorboard")
class TensorboardLogger(TrackerDestination):
    """Writes metrics as TensorBoard scalars and the run's hyperparameters to an event file.

    Each metric becomes a scalar under its own name (``loss/train/total``,
    ``throughput/device/mfu``) at ``step`` (the optimizer step, ``state.timestamp.batch``);
    values that are not numbers are skipped. The hyperparameters (the Trainer's
    ``hyperparameters``: the YAML config and the seed) are flattened to dotted keys
    (:func:`~cadence.loggers.tracker_destination.flatten_hyperparameters`) and written
    once the writer exists, both for the HPARAMS tab and as a JSON text summary named
    ``hyperparameters``. A table (:meth:`log_table`, e.g. the
    :class:`~cadence.callbacks.Generate` callback's ``generations``) is a Markdown text
    summary under its name, at its step.

    The writer is created at ``AFTER_LOAD`` (when the run name, and the step a resumed run
    starts from, are known); anything logged before is kept and written then. A run that
    resumes a checkpoint at step ``N`` continues the same curve in the same folder: its
    writer is opened with ``purge_step=N + 1``, so TensorBoard drops what an earlier attempt
    wrote after the checkpoint (steps trained twice after a hard kill) and shows each step
    once, with the resumed run's values. Events are flushed every ``flush_interval`` batches, at
    ``EPOCH_END``, ``EVAL_END`` and ``FIT_END``, and by :meth:`close` (safe to call twice).
    View with ``tensorboard --logdir runs`` (every run's folder under ``runs/``).

    Args:
        log_dir: the directory of this run's event files; may contain ``{run_name}``.
            Default: ``<save_folder>/tensorboard`` if the run has a ``save_folder``, else
            ``runs/{run_name}/tensorboard``. With ``rank_zero_only=False`` and several
            ranks, each rank writes into ``<log_dir>/rank{r}``.
        flush_interval: flush every this many batches (default 100, as Composer).
        rank_zero_only: write on global rank zero only (default).

    Raises:
        ImportError: ``tensorboard`` is not installed, naming ``pip install tensorboard``.
        ValueError: ``flush_interval`` is not a positive integer.

    Example (YAML)::

        loggers:
          tensorboard: {}              # runs/<run_name>/tensorboard
    """

    package = "tensorboard"

    def __init__(self, log_dir: Optional[str] = None, flush_interval: int = 100,
                 rank_zero_only: bool = True) -> None:
        super().__init__(rank_zero_only)
        if isinstance(flush_interval, bool) or not isinstance(flush_interval, int) \
                or flush_interval < 1:
            raise ValueError(f"TensorboardLogger flush_interval must be a positive integer "
                             f"(batches), got {flush_interval!r}.")
        self.log_dir = log_dir
        self.flush_interval = flush_interval
        self.writer: Any = None  # torch.utils.tensorboard.SummaryWriter once started
        self._closed = False
        self._hyperparameters: dict[str, Any] = {}
        self._pending: list[tuple[dict[str, Any], Optional[int]]] = []
        self._pending_tables: list[tuple[str, str, Optional[int]]] = []

    def _folder(self, state: State) -> Path:
        if self.log_dir is not None:
            folder = Path(self.log_dir.format(run_name=state.run_name))
        elif state.save_folder is not None:
            folder = Path(str(state.save_folder)) / "tensorboard"
        else:
            folder = Path("runs") / state.run_name / "tensorboard"
        if self._per_rank():
            folder = folder / f"rank{get_global_rank()}"
        return folder

    def _start(self, state: State) -> None:
        if self.writer is not None or self._closed or not self._enabled():
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise self.missing_package() from exc
        purge_step = self.resumed_at + 1 if self.resumed_at > 0 else None
        self.writer = SummaryWriter(log_dir=str(self._folder(state)), purge_step=purge_step)
        if self._hyperparameters:
            self._write_hyperparameters()
        pending, self._pending = self._pending, []
        for metrics, step in pending:
            self._write(metrics, step)
        tables, self._pending_tables = self._pending_tables, []
        for name, text, step in tables:
            self.writer.add_text(name, text, global_step=step)

    def _write(self, metrics: Mapping[str, Any], step: Optional[int]) -> None:
        for name, value in metrics.items():
            value = to_python(value)
            if isinstance(value, (int, float)):
                self.writer.add_scalar(str(name), value, global_step=step)

    def _write_hyperparameters(self) -> None:
        from torch.utils.tensorboard.summary import hparams

        experiment, session_start, session_end = hparams(self._hyperparameters, {})
        for summary in (experiment, session_start, session_end):
            self.writer.file_writer.add_summary(summary)
        text = json.dumps(self._hyperparameters, indent=2, sort_keys=True)
        self.writer.add_text("hyperparameters", f"```\n{text}\n```", global_step=0)

    def _flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    # -- LoggerDestination ----------------------------------------------------------------
    def log_metrics(self, metrics: Mapping[str, Any], step: Optional[int] = None) -> None:
        """Write each numeric metric as a scalar at ``step``."""
        self._start_after_init()
        if not self._enabled() or self._closed or not metrics:
            return
        if self.writer is None:
            self._pending.append(({k: to_python(v) for k, v in metrics.items()}, step))
        else:
            self._write(metrics, step)

    def log_hyperparameters(self, hyperparameters: Mapping[str, Any]) -> None:
        """Merge ``hyperparameters`` (flattened) and write them to the event file."""
        self._start_after_init()
        if not self._enabled() or self._closed:
            return
        self._hyperparameters.update(flatten_hyperparameters(hyperparameters))
        if self.writer is not None:
            self._write_hyperparameters()

    def log_table(self, columns: Sequence[str], rows: Sequence[Sequence[Any]],
                  name: str = "Table", step: Optional[int] = None) -> None:
        """Write the table as a Markdown table in a text summary ``name`` at ``step``
        (``add_text``; the TEXT tab renders it; the event file holds it under the tag
        ``{name}/text_summary``). A ``|`` in a cell is escaped and a line break becomes
        ``<br>``, so each row stays one table row."""
        self._start_after_init()
        if not self._enabled() or self._closed:
            return
        text = markdown_table(columns, rows)
        if self.writer is None:
            self._pending_tables.append((name, text, step))
        else:
            self.writer.add_text(name, text, global_step=step)

    def log_images(self, images: Any, name: str = "Images", channels_last: bool = False,
                   step: Optional[int] = None, masks: Optional[Mapping[str, Any]] = None,
                   mask_class_labels: Optional[Mapping[int, str]] = None,
                   use_table: bool = True) -> None:
        """Write ``images`` as one image grid entry ``name`` at ``step`` (``add_images``);
        ``masks`` are written beside them as ``{name}/{mask name}`` gray images scaled to the
        largest class index."""
        del mask_class_labels, use_table
        self._start_after_init()
        if not self._enabled() or self._closed or self.writer is None:
            return
        self.writer.add_images(name, image_batch(images, channels_last), global_step=step)
        for mask_name, mask in (masks or {}).items():
            classes = mask_batch(mask).unsqueeze(1).float()  # [N, 1, H, W]
            self.writer.add_images(f"{name}/{mask_name}", classes / classes.max().clamp(min=1.0),
                                   global_step=step)

    # -- events (AFTER_LOAD and FIT_START start the writer: TrackerDestination) -------------
    def batch_end(self, state: State, logger: Any) -> None:
        del logger
        if int(state.timestamp.batch) % self.flush_interval == 0:
            self._flush()

    def epoch_end(self, state: State, logger: Any) -> None:
        del state, logger
        self._flush()

    def eval_end(self, state: State, logger: Any) -> None:
        del state, logger
        self._flush()

    def fit_end(self, state: State, logger: Any) -> None:
        del state, logger
        self._flush()

    def close(self) -> None:
        """Flush and close the event file. Safe to call twice; metrics logged but never
        written (the writer never started) are dropped."""
        self._start_after_init()
        self._closed = True
        self._pending = []
        self._pending_tables = []
        if self.writer is not None:
            writer, self.writer = self.writer, None
            writer.close()


TensorBoardLogger = TensorboardLogger
"""The same class, spelled as TensorBoard spells itself (Composer spells it ``Tensorboard``)."""
