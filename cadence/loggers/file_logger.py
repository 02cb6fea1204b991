"""The :class:`FileLogger`: metrics as JSON lines, hyperparameters as one JSON file.

Source: the role of MosaicML Composer's ``FileLogger`` (``composer/loggers/file_logger.py``),
with a machine-readable format (one JSON object per line) instead of free text.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

from cadence.utils.dist import get_global_rank
from cadence.loggers.logger_destination import LoggerDestination, to_python
from cadence.registry import loggers

if TYPE_CHECKING:
    from cadence.core.state import State

__all__ = ["FileLogger", "RESUME_EVENT", "jsonable"]

_DEFAULT_FOLDER = "runs/{run_name}"
_DEFAULT_FILENAME = "metrics.jsonl"
_DEFAULT_FILENAME_ALL_RANKS = "metrics_rank{rank}.jsonl"
_HPARAMS_FILENAME = "hparams.json"
RESUME_EVENT = "resume"
"""The ``event`` of the line a resumed run writes first: ``{"event": "resume", "step": N}``."""


def jsonable(value: Any) -> Any:
    """``value`` as strict JSON data.

    Tensors become Python numbers or lists (:func:`to_python`); non-finite floats become
    the strings ``"nan"``, ``"inf"`` and ``"-inf"`` (JSON has no NaN; ``float(s)`` reads
    them back); mappings and sequences are converted item by item; numpy scalars and other
    objects with ``.item()`` are read with it; anything else becomes ``str(value)``.
    """
    value = to_python(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return jsonable(item())
        except (TypeError, ValueError):
            pass
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return jsonable(tolist())
    return str(value)


@loggers.register("file")
class FileLogger(LoggerDestination):
    """Writes each ``log_metrics`` call as one JSON object on its own line::

        {"step": 12, "loss/train/total": 5.1, "lr-AdamW/group0": 0.003}

    to ``<folder>/<filename>`` (default ``runs/<run_name>/metrics.jsonl``), and the
    hyperparameters to ``<folder>/hparams.json`` (rewritten, merged, on each
    ``log_hyperparameters`` call; written by rank zero only).

    Values are written as strict JSON (see :func:`jsonable`): non-finite floats are written
    as the strings ``"nan"``, ``"inf"``, ``"-inf"``. ``step`` is the optimizer step
    (``state.timestamp.batch``) the metrics were logged at. Tables are lines
    ``{"step": s, "table": name, "columns": [...], "data": [[...]]}``; captured output is
    ``{"stdout": "<line>"}`` / ``{"stderr": "<line>"}``, so every line stays JSON.

    The file is opened lazily (on the first metrics, once the run name is known) in append
    mode, so a resumed run continues the same file. A run that resumes a checkpoint at step
    ``N`` first writes the resume mark ``{"event": "resume", "step": N}``: lines after it
    with steps above ``N`` are the resumed run's, and lines before it with steps above ``N``
    (an attempt killed after its last checkpoint) were trained again, so the final curve
    of a step is its last value after the latest mark at or below it (what ``cadence plot``
    draws: :func:`cadence.plot.load_metrics`). Every ``flush_interval`` batches, at
    each epoch's end, at ``FIT_END`` and on ``close`` the file is flushed, ``fsync`` ed and
    handed to ``logger.upload_file`` under ``remote_file_name`` (for destinations that store
    files).

    Composer's arguments (``composer.loggers.FileLogger``) are accepted, with these
    differences, on purpose: the format is JSON lines, not free text (machine-readable,
    one record per call); ``capture_stdout`` / ``capture_stderr`` default to False (a
    jsonl file of metrics is what most runs want; turn them on for one file with
    everything); ``overwrite=False`` appends to an existing file (so an autoresumed run
    continues it) where Composer refuses to start; ``log_traces`` has no effect (cadence's
    engine logs no traces); ``log_level`` (Composer < 0.12) is refused, as cadence has no
    log levels: use ``log_interval``.

    Args:
        filename: the metrics file. With ``folder``: a name inside it (default
            ``metrics.jsonl``, or ``metrics_rank{rank}.jsonl`` with ``log_all_ranks``).
            Without ``folder`` (Composer's form, e.g. ``"{run_name}/logs-rank{rank}.jsonl"``):
            a path relative to the working directory, whose directory also gets
            ``hparams.json``. May contain ``{run_name}`` and ``{rank}``.
        remote_file_name: the name under which the file is uploaded; default
            ``filename`` (Composer's form) or ``{run_name}/<filename>``. Leading ``/`` are
            stripped.
        capture_stdout, capture_stderr: also write what is printed (rank zero, or every
            rank with ``log_all_ranks``), line by line; default False.
        buffer_size: ``open``'s ``buffering``; default 1, line buffered as in Composer (a
            line reaches the OS when written; ``fsync`` happens at flushes).
        log_traces: accepted for Composer code; no effect.
        log_level: must be None (see above).
        log_interval: write the metrics of steps that are multiples of this (and calls
            without a step); default 1, every call.
        flush_interval: flush, ``fsync`` and upload every this many batches; default 100.
        overwrite: truncate an existing file when it is first opened; default False (append).
        folder: the directory; may contain ``{run_name}`` and ``{rank}``. Default: the run's
            ``save_folder`` (``state.save_folder``) if it has one, else ``runs/{run_name}``.
        log_all_ranks: write on every rank (each to its own file) instead of rank zero only.

    Raises:
        ValueError: ``log_all_ranks`` is set but neither ``folder`` nor ``filename`` contains
            ``{rank}``, so ranks would write the same file; a placeholder other than
            ``{run_name}`` and ``{rank}``; ``log_level`` given; a non-positive interval.
    """

    def __init__(self, filename: Optional[str] = None, remote_file_name: Optional[str] = None,
                 *, capture_stdout: bool = False, capture_stderr: bool = False,
                 buffer_size: int = 1, log_traces: bool = True, log_level: Any = None,
                 log_interval: int = 1, flush_interval: int = 100, overwrite: bool = False,
                 folder: Optional[str] = None, log_all_ranks: bool = False) -> None:
        if log_level is not None:
            raise ValueError(f"FileLogger(log_level={log_level!r}): cadence has no log levels "
                             f"(Composer removed them too); use log_interval=N to write every "
                             f"N batches.")
        for name, value in (("log_interval", log_interval), ("flush_interval", flush_interval)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"FileLogger {name} must be a positive int (batches), got "
                                 f"{value!r}.")
        composer_path = filename is not None and folder is None
        if composer_path:
            assert filename is not None
            folder = os.path.dirname(filename) or "."
            remote_default = filename
            filename = os.path.basename(filename)
        self._folder_given = folder is not None
        self.folder_template = str(folder) if folder is not None else _DEFAULT_FOLDER
        if filename is None:
            filename = _DEFAULT_FILENAME_ALL_RANKS if log_all_ranks else _DEFAULT_FILENAME
        if not composer_path:
            remote_default = "{run_name}/" + filename
        self.filename_template = filename
        self.remote_file_name_template = (remote_file_name or remote_default).replace(
            os.path.sep, "/").lstrip("/")
        self.log_all_ranks = log_all_ranks
        if log_all_ranks and "{rank}" not in self.folder_template + self.filename_template:
            raise ValueError(
                f"FileLogger(log_all_ranks=True) needs '{{rank}}' in folder or filename so each "
                f"rank writes its own file; got folder={self.folder_template!r}, "
                f"filename={self.filename_template!r}. Use e.g. "
                f"filename='metrics_rank{{rank}}.jsonl'."
            )
        for template in (self.folder_template, self.filename_template,
                         self.remote_file_name_template):
            self._format(template, "run")  # fail now on an unknown placeholder
        self.buffer_size = buffer_size
        self.should_log_traces = log_traces
        self.log_interval = log_interval
        self.flush_interval = flush_interval
        self.overwrite = overwrite
        self._run_name: Optional[str] = None
        self._folder: Optional[Path] = None
        self._file: Optional[IO[str]] = None
        self._pending_lines: list[str] = []  # metrics logged before the run name was known
        self._hparams: dict[str, Any] = {}
        self._hparams_dirty = False
        self._logger: Any = None
        self._state: Optional[State] = None
        self._captured: list[tuple[Any, Callable[[str], int]]] = []
        self._partial: dict[str, str] = {}
        if capture_stdout:
            self._capture(sys.stdout, "stdout")
        if capture_stderr:
            self._capture(sys.stderr, "stderr")

    # -- captured output -------------------------------------------------------------------
    def _capture(self, stream: Any, key: str) -> None:
        """Wrap ``stream.write`` so each complete line also goes to the file (restored on
        ``close``)."""
        original = stream.write

        def write(text: str) -> int:
            if self._writes():
                buffered = self._partial.get(key, "") + text
                *lines, self._partial[key] = buffered.split("\n")
                for line in lines:
                    self._write_line(json.dumps({key: line}))
            return original(text)

        stream.write = write
        self._captured.append((stream, write))

    def _release_streams(self) -> None:
        for stream, write in self._captured:
            if stream.__dict__.get("write") is write:
                del stream.write  # the class's write again
        self._captured = []
        for key, rest in self._partial.items():
            if rest:
                self._write_line(json.dumps({key: rest}))
        self._partial = {}

    @property
    def filename(self) -> Optional[str]:
        """The metrics file's path as a string, once the run name is known (Composer's name)."""
        path = self.path
        return None if path is None else str(path)

    @property
    def remote_file_name(self) -> Optional[str]:
        """The name the file is uploaded under, once the run name is known."""
        if self._run_name is None:
            return None
        return self._format(self.remote_file_name_template, self._run_name)

    # -- paths ----------------------------------------------------------------------------
    @property
    def folder(self) -> Optional[Path]:
        """The resolved folder, once the run name is known (``init`` or ``fit_start``)."""
        return self._folder

    @property
    def path(self) -> Optional[Path]:
        """The resolved metrics file path, once the run name is known."""
        if self._folder is None or self._run_name is None:
            return None
        return self._folder / self._format(self.filename_template, self._run_name)

    @property
    def hparams_path(self) -> Optional[Path]:
        """The resolved ``hparams.json`` path, once the run name is known."""
        return None if self._folder is None else self._folder / _HPARAMS_FILENAME

    @staticmethod
    def _format(template: str, run_name: str) -> str:
        try:
            return template.format(run_name=run_name, rank=get_global_rank())
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(
                f"FileLogger path {template!r} has an unknown placeholder {exc}; only "
                f"{{run_name}} and {{rank}} are filled in."
            ) from None

    def _writes(self) -> bool:
        return self.log_all_ranks or get_global_rank() == 0

    def _resolve(self, run_name: str, save_folder: Optional[str] = None) -> None:
        if self._folder is not None:
            return
        if not self._folder_given and save_folder is not None:
            self.folder_template = str(save_folder)  # the run's save_folder wins over runs/
        self._run_name = run_name
        self._folder = Path(self._format(self.folder_template, run_name))
        if self._pending_lines:
            for line in self._pending_lines:
                self._write_line(line)
            self._pending_lines = []
        if self._hparams_dirty:
            self._write_hparams()

    def _open(self) -> IO[str]:
        if self._file is None:
            path = self.path
            assert path is not None, "resolve the run name before opening"
            path.parent.mkdir(parents=True, exist_ok=True)
            mode = "w" if self.overwrite else "a"
            self._file = open(path, mode, buffering=self.buffer_size,  # closed in close()
                              encoding="utf-8")
        return self._file

    def _write_line(self, line: str) -> None:
        if self._folder is None:
            self._pending_lines.append(line)
        else:
            self._open().write(line + "\n")

    def _write_hparams(self) -> None:
        self._hparams_dirty = True
        if self._folder is None or get_global_rank() != 0:
            return
        path = self._folder / _HPARAMS_FILENAME
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self._hparams, indent=2, allow_nan=False) + "\n",
                       encoding="utf-8")
        os.replace(tmp, path)
        self._hparams_dirty = False

    def flush(self) -> None:
        """Push buffered lines to the file."""
        if self._file is not None:
            self._file.flush()

    def _flush_file(self) -> None:
        """Flush, ``fsync`` and hand the file to ``logger.upload_file`` (Composer's flush)."""
        if self._file is None:
            return
        self._file.flush()
        os.fsync(self._file.fileno())
        if self._logger is not None and self.path is not None:
            self._logger.upload_file(self.remote_file_name, self.path, overwrite=True)

    # -- LoggerDestination ----------------------------------------------------------------
    def log_metrics(self, metrics: Mapping[str, Any], step: Optional[int] = None) -> None:
        """Write ``{"step": step, **metrics}`` as one line (buffered)."""
        if not self._writes() or not metrics:
            return
        if step is not None and int(step) % self.log_interval != 0:
            return
        record: dict[str, Any] = {"step": step}
        for key, value in metrics.items():
            record[str(key)] = jsonable(value)
        self._write_line(json.dumps(record, allow_nan=False))

    def log_hyperparameters(self, hyperparameters: Mapping[str, Any]) -> None:
        """Merge ``hyperparameters`` into ``hparams.json`` and rewrite it (rank zero)."""
        if get_global_rank() != 0:
            return
        self._hparams.update(jsonable(dict(hyperparameters)))
        self._write_hparams()

    def log_table(self, columns: Sequence[str], rows: Sequence[Sequence[Any]],
                  name: str = "Table", step: Optional[int] = None) -> None:
        """Write ``{"step", "table": name, "columns", "data"}`` as one line."""
        if not self._writes():
            return
        record = {"step": step, "table": name, "columns": list(columns),
                  "data": jsonable([list(row) for row in rows])}
        self._write_line(json.dumps(record, allow_nan=False))

    # -- events ---------------------------------------------------------------------------
    def init(self, state: State, logger: Any) -> None:
        self._logger, self._state = logger, state
        self._resolve(state.run_name, state.save_folder)

    def after_load(self, state: State, logger: Any) -> None:
        del logger
        step = int(state.timestamp.batch)
        if step > 0 and self._writes():  # a checkpoint was loaded: mark where this run starts
            self._resolve(state.run_name, state.save_folder)
            self._write_line(json.dumps({"event": RESUME_EVENT, "step": step}))

    def fit_start(self, state: State, logger: Any) -> None:
        del logger
        self._resolve(state.run_name, state.save_folder)

    def eval_before_all(self, state: State, logger: Any) -> None:
        del logger
        self._resolve(state.run_name, state.save_folder)

    def batch_end(self, state: State, logger: Any) -> None:
        self._logger = logger if logger is not None else self._logger
        if int(state.timestamp.batch) % self.flush_interval == 0:
            self._flush_file()
        else:
            self.flush()

    def epoch_end(self, state: State, logger: Any) -> None:
        del state
        self._logger = logger if logger is not None else self._logger
        self._flush_file()

    def eval_end(self, state: State, logger: Any) -> None:
        del state, logger
        self.flush()

    def fit_end(self, state: State, logger: Any) -> None:
        del state
        self._logger = logger if logger is not None else self._logger
        self._flush_file()

    def close(self, state: Optional[State] = None, logger: Any = None) -> None:
        """Flush, upload (``logger.upload_file``, when a destination stores files) and close
        the file. Composer's signature, ``close(state, logger)``; both may be left out. Safe
        to call twice.

        Metrics logged before the run name was ever known (no ``init``/``fit_start``) are
        written under the run name ``run``.
        """
        del state
        self._logger = logger if logger is not None else self._logger
        self._release_streams()
        if self._pending_lines or (self._hparams_dirty and self._folder is None):
            self._resolve("run")
        if self._file is not None:
            self._flush_file()
            self._file.close()
            self._file = None
