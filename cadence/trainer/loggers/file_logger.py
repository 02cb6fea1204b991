"""The :class:`FileLogger`: metrics as JSON lines, hyperparameters as one JSON file.

Source: the role of MosaicML Composer's ``FileLogger`` (``composer/loggers/file_logger.py``),
with a machine-readable format (one JSON object per line) instead of free text.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Mapping, Optional

from cadence.trainer.dist import get_global_rank
from cadence.trainer.loggers.logger import LoggerDestination, to_python
from cadence.trainer.registry import loggers

if TYPE_CHECKING:
    from cadence.trainer.core.state import State

__all__ = ["FileLogger", "jsonable"]

_DEFAULT_FOLDER = "runs/{run_name}"
_DEFAULT_FILENAME = "metrics.jsonl"
_DEFAULT_FILENAME_ALL_RANKS = "metrics_rank{rank}.jsonl"
_HPARAMS_FILENAME = "hparams.json"


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
    (``state.timestamp.batch``) the metrics were logged at.

    The file is opened lazily (on the first metrics, once the run name is known) in append
    mode, so a resumed run continues the same file. Lines are buffered and flushed at
    ``BATCH_END``, ``EPOCH_END``, ``EVAL_END`` and ``FIT_END``, not on every call.

    Args:
        folder: the directory; may contain ``{run_name}`` and ``{rank}``. Default: the run's
            ``save_folder`` (``state.save_folder``) if it has one, else ``runs/{run_name}``.
        filename: the metrics file's name inside ``folder``; may contain ``{run_name}`` and
            ``{rank}``. Default ``metrics.jsonl``, or ``metrics_rank{rank}.jsonl`` with
            ``log_all_ranks``.
        log_all_ranks: write on every rank (each to its own file) instead of rank zero only.

    Raises:
        ValueError: ``log_all_ranks`` is set but neither ``folder`` nor ``filename`` contains
            ``{rank}``, so ranks would write the same file; or a placeholder other than
            ``{run_name}`` and ``{rank}`` is used.
    """

    def __init__(self, folder: Optional[str] = None, filename: Optional[str] = None,
                 log_all_ranks: bool = False) -> None:
        self._folder_given = folder is not None
        self.folder_template = str(folder) if folder is not None else _DEFAULT_FOLDER
        if filename is None:
            filename = _DEFAULT_FILENAME_ALL_RANKS if log_all_ranks else _DEFAULT_FILENAME
        self.filename_template = filename
        self.log_all_ranks = log_all_ranks
        if log_all_ranks and "{rank}" not in self.folder_template + self.filename_template:
            raise ValueError(
                f"FileLogger(log_all_ranks=True) needs '{{rank}}' in folder or filename so each "
                f"rank writes its own file; got folder={self.folder_template!r}, "
                f"filename={self.filename_template!r}. Use e.g. "
                f"filename='metrics_rank{{rank}}.jsonl'."
            )
        for template in (self.folder_template, self.filename_template):
            self._format(template, "run")  # fail now on an unknown placeholder
        self._run_name: Optional[str] = None
        self._folder: Optional[Path] = None
        self._file: Optional[IO[str]] = None
        self._pending_lines: list[str] = []  # metrics logged before the run name was known
        self._hparams: dict[str, Any] = {}
        self._hparams_dirty = False

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
            self._file = open(path, "a", encoding="utf-8")  # closed in close()
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

    # -- LoggerDestination ----------------------------------------------------------------
    def log_metrics(self, metrics: Mapping[str, Any], step: Optional[int] = None) -> None:
        """Write ``{"step": step, **metrics}`` as one line (buffered)."""
        if not self._writes() or not metrics:
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

    # -- events ---------------------------------------------------------------------------
    def init(self, state: State, logger: Any) -> None:
        del logger
        self._resolve(state.run_name, state.save_folder)

    def fit_start(self, state: State, logger: Any) -> None:
        del logger
        self._resolve(state.run_name, state.save_folder)

    def eval_before_all(self, state: State, logger: Any) -> None:
        del logger
        self._resolve(state.run_name, state.save_folder)

    def batch_end(self, state: State, logger: Any) -> None:
        del state, logger
        self.flush()

    def epoch_end(self, state: State, logger: Any) -> None:
        del state, logger
        self.flush()

    def eval_end(self, state: State, logger: Any) -> None:
        del state, logger
        self.flush()

    def fit_end(self, state: State, logger: Any) -> None:
        del state, logger
        self.flush()

    def close(self) -> None:
        """Flush and close the file. Safe to call twice.

        Metrics logged before the run name was ever known (no ``init``/``fit_start``) are
        written under the run name ``run``.
        """
        if self._pending_lines or (self._hparams_dirty and self._folder is None):
            self._resolve("run")
        if self._file is not None:
            self._file.close()
            self._file = None
