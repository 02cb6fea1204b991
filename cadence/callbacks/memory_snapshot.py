"""The :class:`MemorySnapshot` callback: the CUDA caching allocator's history of allocations
and frees over a few batches, written as a snapshot and an HTML trace plot.

Source: MosaicML Composer's ``MemorySnapshot`` (``composer/callbacks/memory_snapshot.py``),
on PyTorch's allocator history (``torch.cuda.memory._record_memory_history``,
``torch.cuda.memory._snapshot``, ``torch.cuda._memory_viz``; see
https://pytorch.org/docs/stable/torch_cuda_memory.html).
"""

from __future__ import annotations

import logging
import os
import pickle
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

import torch

from cadence.registry import callbacks
from cadence.core import Callback, Time, TimeUnit
from cadence.utils import dist

if TYPE_CHECKING:
    from cadence.core import State

__all__ = ["MemorySnapshot", "trace_name", "model_on_cuda"]

log = logging.getLogger(__name__)


def trace_name(template: str, state: State) -> str:
    """``template`` with ``{run_name}``, ``{rank}``, ``{local_rank}``, ``{world_size}``,
    ``{local_world_size}``, ``{node_rank}`` (this rank's), ``{epoch}``, ``{batch}``,
    ``{batch_in_epoch}``, ``{sample}``, ``{token}`` filled in.

    Raises:
        ValueError: another field, naming the template and the known fields.
    """
    ts = state.timestamp
    values = dict(run_name=state.run_name, rank=dist.get_global_rank(),
                  local_rank=dist.get_local_rank(), world_size=dist.get_world_size(),
                  local_world_size=dist.get_local_world_size(), node_rank=dist.get_node_rank(),
                  epoch=int(ts.epoch), batch=int(ts.batch),
                  batch_in_epoch=int(ts.batch_in_epoch), sample=int(ts.sample),
                  token=int(ts.token))
    try:
        return template.format(**values)
    except (KeyError, IndexError) as exc:
        raise ValueError(f"{template!r} has the unknown field {exc}; known: "
                         f"{sorted(values)}.") from None


def model_on_cuda(state: State, owner: str) -> bool:
    """Whether the model's parameters are on CUDA (or meta, to be materialised there);
    otherwise warns once, naming ``owner`` and the device, and returns False."""
    param = next(state.model.parameters(), None)
    device = param.device.type if param is not None else "cpu"
    if device in ("cuda", "meta"):
        return True
    warnings.warn(f"{owner} works on CUDA devices only (it records the CUDA caching "
                  f"allocator), but the model is on {device}: it does nothing in this run.",
                  stacklevel=2)
    return False


def prepare_folder(template: str, state: State, overwrite: bool, owner: str) -> Path:
    """The trace folder (``template`` filled in), created; with ``overwrite`` False it must
    be empty.

    Raises:
        FileExistsError: it holds files and ``overwrite`` is False.
    """
    folder = Path(trace_name(template, state))
    folder.mkdir(parents=True, exist_ok=True)
    if not overwrite and any(folder.iterdir()):
        raise FileExistsError(f"{owner}: the trace folder {folder} is not empty; pass "
                              f"overwrite=True or choose another folder.")
    return folder


def upload(logger: Any, remote_prefix: Optional[str], files: list[str], prefix: str,
           overwrite: bool, owner: str) -> None:
    """Hand ``files`` (local paths starting with ``prefix``) to ``logger.upload_file`` as
    ``remote_prefix`` + the part of each name after ``prefix``."""
    if remote_prefix is None or logger is None:
        return
    for path in files:
        remote = (remote_prefix + path[len(prefix):]).lstrip("/")
        try:
            logger.upload_file(remote, path, overwrite=overwrite)
        except FileExistsError as exc:
            raise FileExistsError(f"{owner}: uploading {path} failed ({exc}); pass "
                                  f"overwrite=True to replace it.") from exc


@callbacks.register("memory_snapshot")
class MemorySnapshot(Callback):
    """Records the CUDA caching allocator's history (every allocation and free, with its
    Python stack) over ``interval`` after the first ``skip_batches`` batches, once; then
    writes ``<folder>/<filename>.pickle`` (the snapshot, for https://pytorch.org/memory_viz)
    and ``<filename>.html`` (a trace plot) and uploads both to the run's file destinations.

    On CPU (the model's parameters not on CUDA) it warns once at ``INIT`` and does nothing.

    Args:
        skip_batches: batches to let pass before recording (default 1).
        interval: how long to record: batches (``'3ba'``, an int) or epochs. Default
            ``'3ba'``.
        max_entries: the most alloc/free events kept (``trace_alloc_max_entries``; default
            100000).
        folder: local folder of the files, with ``{run_name}``, ``{rank}``... (see
            :func:`trace_name`); default ``'{run_name}/torch_traces'`` (relative to the
            working directory, as in Composer).
        filename: the files' name prefix; default ``'rank{rank}.{batch}.memory_snapshot'``
            (``{batch}``: the batch the recording ended at).
        remote_file_name: the uploaded name prefix (the files' suffixes are added); None:
            no upload. Default
            ``'{run_name}/torch_memory_traces/rank{rank}.{batch}.memory_snapshot'``.
        overwrite: replace existing files; when False the folder must be empty at ``INIT``
            and uploads do not replace objects. Default False.

    Raises:
        ValueError: ``skip_batches`` or ``max_entries`` negative, ``interval`` not positive
            batches or epochs.
        FileExistsError: at ``INIT``, the folder is not empty and ``overwrite`` is False.
    """

    def __init__(self, skip_batches: int = 1, interval: Union[int, str, Time] = "3ba",
                 max_entries: int = 100000, folder: str = "{run_name}/torch_traces",
                 filename: str = "rank{rank}.{batch}.memory_snapshot",
                 remote_file_name: Optional[str] = (
                     "{run_name}/torch_memory_traces/rank{rank}.{batch}.memory_snapshot"),
                 overwrite: bool = False) -> None:
        self.interval = Time.from_input(interval, TimeUnit.BATCH)
        if self.interval.unit not in (TimeUnit.BATCH, TimeUnit.EPOCH) or self.interval.value < 1:
            raise ValueError(f"MemorySnapshot interval must be a positive number of batches or "
                             f"epochs (e.g. '3ba'), got {interval!r}.")
        if int(skip_batches) < 0 or int(max_entries) < 1:
            raise ValueError(f"MemorySnapshot needs skip_batches >= 0 and max_entries >= 1, got "
                             f"{skip_batches!r} and {max_entries!r}.")
        self.batches_left_to_skip = int(skip_batches)
        self.max_entries = int(max_entries)
        self.folder = folder
        self.folder_name: Optional[Path] = None
        self.filename = filename
        self.remote_file_name = remote_file_name
        self.overwrite = overwrite
        self._start_time: Optional[int] = None
        self._enabled = True
        self.saved: list[str] = []  # files written, for inspection

    def init(self, state: State, logger: Any) -> None:
        del logger
        if not model_on_cuda(state, "MemorySnapshot"):
            self._enabled = False
            return
        self.folder_name = prepare_folder(self.folder, state, self.overwrite, "MemorySnapshot")

    def batch_start(self, state: State, logger: Any) -> None:
        del logger
        if self._enabled and self._start_time is None and self.batches_left_to_skip == 0:
            log.info("MemorySnapshot: recording the CUDA allocator's history.")
            torch.cuda.memory._record_memory_history(max_entries=self.max_entries)
            self._start_time = int(state.timestamp.get(self.interval.unit))

    def batch_end(self, state: State, logger: Any) -> None:
        if not self._enabled:
            return
        if self.batches_left_to_skip > 0:
            self.batches_left_to_skip -= 1
            return
        if self._start_time is None:
            return
        if int(state.timestamp.get(self.interval.unit)) >= self._start_time + self.interval.value:
            try:
                self.export_memory_snapshot(state, logger)
            finally:
                torch.cuda.memory._record_memory_history(enabled=None)
                self._start_time = None
                self._enabled = False

    def export_memory_snapshot(self, state: State, logger: Any) -> None:
        """Write the snapshot and its trace plot, then upload them. Failures to build the
        files are logged as errors, not raised (a diagnostic must not end the run)."""
        assert self.folder_name is not None, "INIT sets the folder"
        prefix = os.path.join(str(self.folder_name), trace_name(self.filename, state))
        try:
            snapshot = torch.cuda.memory._snapshot()
            if all(len(trace) == 0 for trace in snapshot.get("device_traces", [])):
                log.info("MemorySnapshot: no allocation was recorded.")
                return
            files = [prefix + ".pickle", prefix + ".html"]
            with open(files[0], "wb") as handle:
                pickle.dump(snapshot, handle)
            from torch.cuda import _memory_viz

            with open(files[1], "w", encoding="utf-8") as handle:
                handle.write(_memory_viz.trace_plot(snapshot))
        except Exception as exc:  # noqa: BLE001  (reported, training goes on)
            log.error("MemorySnapshot: could not write the snapshot %s: %s", prefix, exc)
            return
        self.saved += files
        log.info("MemorySnapshot: wrote %s", ", ".join(files))
        remote = (None if self.remote_file_name is None
                  else trace_name(self.remote_file_name, state))
        upload(logger, remote, files, prefix, self.overwrite, "MemorySnapshot")
