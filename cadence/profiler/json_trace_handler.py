"""The :class:`JSONTraceHandler`: the profiler's events as Chrome JSON trace files.

Source: MosaicML Composer's ``composer.profiler.JSONTraceHandler`` (same arguments,
defaults and file names). The files follow the Chrome trace event format (a JSON array of
events; open them in https://ui.perfetto.dev or ``chrome://tracing``). Durations are written
as complete events (``"ph": "X"`` with ``"dur"``, microseconds), where Composer writes
``B``/``E`` pairs: the viewers show both alike, and a span still open when a window is saved
cannot leave a dangling half in the next file.
"""

from __future__ import annotations

import gzip
import json
import os
import pathlib
import time
from typing import TYPE_CHECKING, Any, Optional, Union

from cadence.profiler.profiler_action import ProfilerAction
from cadence.profiler.trace_handler import TraceHandler, format_trace_name
from cadence.utils import dist

if TYPE_CHECKING:
    from cadence.core import State, Timestamp

__all__ = ["JSONTraceHandler"]


def read_trace_events(path: Union[str, pathlib.Path]) -> list[dict[str, Any]]:
    """The events of a Chrome JSON trace file (a list, or a dict with ``traceEvents``;
    gzipped when the name ends with ``.gz``; a list missing its closing ``]``, which the
    format allows, is read too).

    Raises:
        TypeError: the file holds neither form.
    """
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:  # type: ignore[operator]
        text = f.read().strip()
    if text.startswith("[") and not text.endswith("]"):
        text = text.rstrip(",") + "]"
    data = json.loads(text)
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise TypeError(f"{path} is not a Chrome trace: expected a list of events or a dict "
                        f"with 'traceEvents'.")
    return events


class JSONTraceHandler(TraceHandler):
    """Writes the profiler's events, and the torch profiler's trace of the same batches, to
    one Chrome JSON trace file per profiling window.

    Events are collected from the first batch of a window (the schedule's first non-``SKIP``
    batch) and written at the end of its ``ACTIVE_AND_SAVE`` batch to
    ``{folder}/{filename}``. Each rank writes its own file; local rank zero also merges the
    node's files, window after window, into ``{folder}/{merged_trace_filename}``.

    Args:
        folder: where trace files go; takes ``{run_name}``, ``{rank}``, ``{node_rank}``, ...
            (default ``'{run_name}/traces'``, relative to the working directory).
        filename: each window's file; also takes the timestamp's ``{epoch}``, ``{batch}``, ...
            (default ``'ep{epoch}-ba{batch}-rank{rank}.json'``).
        remote_file_name: the name each file is uploaded under through the run's file
            destinations (``logger.upload_file``; nothing happens without one); ``None``: no
            upload. Default ``'{run_name}/traces/ep{epoch}-ba{batch}-rank{rank}.json'``.
        merged_trace_filename: the node's merged trace, in ``folder``; ``None``: no merging.
            Default ``'merged_trace.json'``.
        merged_trace_remote_file_name: the merged trace's upload name; ``None``: no upload.
        overwrite: allow a ``folder`` that already holds files (default False).
        num_traces_to_keep: window files this rank keeps, the oldest deleted first; ``-1``
            (default): all.

    Attributes:
        saved_traces: ``(timestamp, [path of each rank's file])`` per window written.

    Raises:
        FileExistsError: at ``INIT``, ``folder`` holds files and ``overwrite`` is False.
        RuntimeError: the run has no profiler (pass ``Trainer(profiler=Profiler(...))``).
    """

    def __init__(self, folder: str = "{run_name}/traces",
                 filename: str = "ep{epoch}-ba{batch}-rank{rank}.json",
                 remote_file_name: Optional[str] = "{run_name}/traces/ep{epoch}-ba{batch}-rank{rank}.json",
                 merged_trace_filename: Optional[str] = "merged_trace.json",
                 merged_trace_remote_file_name: Optional[str] = "{run_name}/traces/merged_trace.json",
                 *, overwrite: bool = False, num_traces_to_keep: int = -1) -> None:
        if num_traces_to_keep < -1:
            raise ValueError(f"JSONTraceHandler num_traces_to_keep must be -1 (all) or >= 0, "
                             f"got {num_traces_to_keep}.")
        self.folder = folder
        self.filename = filename
        self.remote_file_name = remote_file_name
        self.merged_trace_filename = merged_trace_filename
        self.merged_trace_remote_file_name = merged_trace_remote_file_name
        self.overwrite = overwrite
        self.num_traces_to_keep = num_traces_to_keep
        self.saved_traces: list[tuple[Timestamp, list[pathlib.Path]]] = []
        self._events: list[dict[str, Any]] = []
        self._open: dict[tuple[str, int, int], int] = {}  # span start (us) by (name, pid, tid)
        self._active = False
        self._save_at_batch_end = False
        self._written: list[pathlib.Path] = []

    # -- events from markers and other profilers -------------------------------------------
    def _record(self, event: dict[str, Any]) -> None:
        self._events.append(event)

    @staticmethod
    def _args(timestamp: Timestamp) -> dict[str, int]:
        return {"epoch": int(timestamp.epoch), "batch": int(timestamp.batch)}

    def process_duration_event(self, name: str, categories: Any, is_start: bool,
                               timestamp: Timestamp, wall_clock_time_ns: int, global_rank: int,
                               pid: int) -> None:
        key = (name, global_rank, pid)
        if is_start:
            self._open[key] = wall_clock_time_ns // 1000
            return
        start = self._open.pop(key, None)
        if start is None:  # its start was before this window was opened
            return
        event = {"name": name, "ph": "X", "ts": start, "dur": wall_clock_time_ns // 1000 - start,
                 "pid": global_rank, "tid": pid, "args": self._args(timestamp)}
        if categories:
            event["cat"] = ",".join(categories)
        self._record(event)

    def process_instant_event(self, name: str, categories: Any, timestamp: Timestamp,
                              wall_clock_time_ns: int, global_rank: int, pid: int) -> None:
        event = {"name": name, "ph": "i", "s": "p", "ts": wall_clock_time_ns // 1000,
                 "pid": global_rank, "tid": pid, "args": self._args(timestamp)}
        if categories:
            event["cat"] = ",".join(categories)
        self._record(event)

    def process_counter_event(self, name: str, categories: Any, timestamp: Timestamp,
                              wall_clock_time_ns: int, global_rank: int, pid: int,
                              values: dict[str, Union[int, float]]) -> None:
        event = {"name": name, "ph": "C", "ts": wall_clock_time_ns // 1000, "pid": global_rank,
                 "tid": pid, "args": dict(values)}
        if categories:
            event["cat"] = ",".join(categories)
        self._record(event)

    def process_chrome_json_trace_file(self, filepath: pathlib.Path) -> None:
        """Add a torch profiler trace's events to the window (their ``pid`` becomes the
        global rank, as the profiler's own events; the torch profiler's process-name rows
        are left out)."""
        rank = dist.get_global_rank()
        for event in read_trace_events(filepath):
            if "pid" not in event or "tid" not in event or "PyTorch Profiler" in str(event["tid"]):
                continue
            if event.get("ph") == "M" and event.get("name") in ("process_name", "process_sort_index"):
                continue
            self._record({**event, "pid": rank})

    # -- the window ---------------------------------------------------------------------------
    def init(self, state: State, logger: Any) -> None:
        del logger
        folder = pathlib.Path(format_trace_name(self.folder, state, with_time=False))
        folder.mkdir(parents=True, exist_ok=True)
        if not self.overwrite and any(folder.iterdir()):
            raise FileExistsError(f"JSONTraceHandler folder {folder} is not empty; use an empty "
                                  f"folder or JSONTraceHandler(overwrite=True).")
        if self.merged_trace_filename is not None and dist.get_local_rank() == 0:
            merged = folder / format_trace_name(self.merged_trace_filename, state, with_time=False)
            merged.unlink(missing_ok=True)
        dist.barrier()  # every rank checked the folder before any writes to it

    def batch_start(self, state: State, logger: Any) -> None:
        del logger
        if state.profiler is None:
            raise RuntimeError("JSONTraceHandler needs the run's profiler: pass it in "
                               "Profiler(trace_handlers=[...]) and Trainer(profiler=...).")
        action = state.profiler.schedule(state)
        if action != ProfilerAction.SKIP and not self._active:
            self._open_window()
        if action == ProfilerAction.ACTIVE_AND_SAVE:
            self._save_at_batch_end = True

    def _open_window(self) -> None:
        """Name this rank's rows in the viewer, sorted by rank."""
        rank, pid, now = dist.get_global_rank(), os.getpid(), time.time_ns() // 1000
        for name, args in (("process_name", {"name": f"Rank {rank} training loop process"}),
                           ("thread_name", {"name": "Training Loop"}),
                           ("process_sort_index", {"sort_index": rank}),
                           ("thread_sort_index", {"sort_index": 0})):
            self._record({"name": name, "ph": "M", "ts": now, "pid": rank, "tid": pid,
                          "args": args})
        self._active = True

    def batch_end(self, state: State, logger: Any) -> None:
        if not self._save_at_batch_end:
            return
        self._save_at_batch_end = self._active = False
        folder = pathlib.Path(format_trace_name(self.folder, state, with_time=False))
        path = folder / format_trace_name(self.filename, state)
        path.parent.mkdir(parents=True, exist_ok=True)
        events, self._events, self._open = self._events, [], {}
        with open(path, "w") as f:
            json.dump(events, f)
        if self.remote_file_name is not None:
            logger.upload_file(format_trace_name(self.remote_file_name, state), path,
                               overwrite=self.overwrite)
        paths = [pathlib.Path(p) for p in dist.all_gather_object(str(path))]
        self.saved_traces.append((state.timestamp, paths))
        dist.barrier()  # every rank's file is written before local rank zero merges
        if self.merged_trace_filename is not None and dist.get_local_rank() == 0:
            self._merge(state, logger, folder, paths)
        self._written.append(path)
        if self.num_traces_to_keep >= 0:
            while len(self._written) > self.num_traces_to_keep:
                self._written.pop(0).unlink(missing_ok=True)

    def _merge(self, state: State, logger: Any, folder: pathlib.Path,
               paths: list[pathlib.Path]) -> None:
        """Add this window's files of the node's ranks to the merged trace."""
        first = dist.get_global_rank()
        node_paths = paths[first:first + dist.get_local_world_size()]
        merged = folder / format_trace_name(self.merged_trace_filename or "", state, with_time=False)
        events = read_trace_events(merged) if merged.exists() else []
        for path in node_paths:
            events.extend(read_trace_events(path))
        tmp = merged.with_name(merged.name + ".tmp")
        with open(tmp, "w") as f:
            json.dump(events, f)
        os.replace(tmp, merged)
        if self.merged_trace_remote_file_name is not None:
            logger.upload_file(format_trace_name(self.merged_trace_remote_file_name, state,
                                                 with_time=False), merged, overwrite=True)
