"""The :class:`OOMObserver` callback: when CUDA runs out of memory, write what the allocator
held (a snapshot and its plots) before the memory is released.

Source: MosaicML Composer's ``OOMObserver`` (``composer/callbacks/oom_observer.py``), on
PyTorch's allocator history and out-of-memory observer
(``torch._C._cuda_attach_out_of_memory_observer``, ``torch.cuda._memory_viz``; see
https://pytorch.org/docs/stable/torch_cuda_memory.html).
"""

from __future__ import annotations

import logging
import os
import pickle
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import torch

from cadence.callbacks.memory_snapshot import model_on_cuda, prepare_folder, trace_name, upload
from cadence.registry import callbacks
from cadence.core import Callback

if TYPE_CHECKING:
    from cadence.core import State

__all__ = ["OOMObserver"]

log = logging.getLogger(__name__)

#: File suffix -> how it is made from the snapshot (a ``torch.cuda._memory_viz`` function).
_VISUALS = (("_trace_plot.html", "trace_plot"), ("_segment_plot.html", "segment_plot"),
            ("_segment_flamegraph.svg", "segments"), ("_memory_flamegraph.svg", "memory"))


@callbacks.register("oom_observer")
class OOMObserver(Callback):
    """At ``INIT`` starts recording the CUDA allocator's history and registers an observer
    that PyTorch calls when an allocation fails with out-of-memory, before anything is freed
    while the error unwinds. The observer writes, in ``folder``, ``<filename>_snapshot.pickle``
    (open it at https://pytorch.org/memory_viz), a trace plot, a segment plot and two
    flamegraphs (segments, memory), and uploads them to the run's file destinations. The
    OOM error itself is raised as usual.

    Recording costs a little host time on every allocation (the stack of each is kept, up
    to ``max_entries`` events). On CPU (the model's parameters not on CUDA) it warns once
    at ``INIT`` and does nothing.

    Args:
        max_entries: the most alloc/free events kept (default 100000).
        folder: local folder, with ``{run_name}``, ``{rank}``... (see
            :func:`~cadence.callbacks.memory_snapshot.trace_name`); default
            ``'{run_name}/torch_traces'``.
        filename: the files' name prefix; default ``'rank{rank}.oom'``.
        remote_file_name: the uploaded name prefix (the files' suffixes are added); None: no
            upload. Default ``'{run_name}/oom_traces/rank{rank}.oom'``.
        overwrite: replace existing files (else the folder must be empty at ``INIT``).
            Default False.

    Attributes:
        saved: the files written by the last OOM.

    Raises:
        ValueError: ``max_entries`` below 1.
        FileExistsError: at ``INIT``, the folder is not empty and ``overwrite`` is False.
    """

    def __init__(self, max_entries: int = 100000, folder: str = "{run_name}/torch_traces",
                 filename: str = "rank{rank}.oom",
                 remote_file_name: Optional[str] = "{run_name}/oom_traces/rank{rank}.oom",
                 overwrite: bool = False) -> None:
        if int(max_entries) < 1:
            raise ValueError(f"OOMObserver max_entries must be >= 1, got {max_entries!r}.")
        self.max_entries = int(max_entries)
        self.folder = folder
        self.folder_name: Optional[Path] = None
        self.filename = filename
        self.remote_file_name = remote_file_name
        self.overwrite = overwrite
        self._enabled = True
        self.saved: list[str] = []

    def init(self, state: State, logger: Any) -> None:
        if not model_on_cuda(state, "OOMObserver"):
            self._enabled = False
            return
        self.folder_name = prepare_folder(self.folder, state, self.overwrite, "OOMObserver")

        def observer(device: int, alloc: int, device_alloc: int, device_free: int) -> None:
            del device, alloc, device_alloc, device_free
            self.dump(state, logger)

        torch.cuda.memory._record_memory_history(max_entries=self.max_entries)
        torch._C._cuda_attach_out_of_memory_observer(observer)
        log.info("OOMObserver: recording the CUDA allocator's history; an OOM writes it to %s.",
                 self.folder_name)

    def dump(self, state: State, logger: Any) -> list[str]:
        """Write the snapshot and its visualisations now (what the observer does on OOM) and
        upload them; returns the files. A failure is logged, not raised: the OOM error that
        triggered it is what the run must see."""
        assert self.folder_name is not None, "INIT sets the folder"
        prefix = os.path.join(str(self.folder_name), trace_name(self.filename, state))
        log.warning("OOMObserver: CUDA out of memory; writing the allocator's state to %s*.",
                    prefix)
        try:
            snapshot = torch.cuda.memory._snapshot()
            if all(len(trace) == 0 for trace in snapshot.get("device_traces", [])):
                log.info("OOMObserver: no allocation was recorded.")
                return []
            from torch.cuda import _memory_viz

            files = [prefix + "_snapshot.pickle"]
            with open(files[0], "wb") as handle:
                pickle.dump(snapshot, handle)
            for suffix, function in _VISUALS:
                files.append(prefix + suffix)
                with open(files[-1], "w", encoding="utf-8") as handle:
                    handle.write(getattr(_memory_viz, function)(snapshot))
        except Exception as exc:  # noqa: BLE001  (reported; the OOM error follows)
            log.error("OOMObserver: could not write the memory snapshot %s: %s", prefix, exc)
            return []
        self.saved = files
        remote = (None if self.remote_file_name is None
                  else trace_name(self.remote_file_name, state))
        upload(logger, remote, files, prefix, self.overwrite, "OOMObserver")
        return files
