"""The :class:`TorchProfiler`: ``torch.profiler`` driven by the run's profiler schedule.

Source: MosaicML Composer's ``composer.profiler.TorchProfiler`` (same arguments, defaults
and file names) over PyTorch's ``torch.profiler.profile``. Each saved window is a Chrome
trace (the format ``torch.profiler.tensorboard_trace_handler`` writes too, so a folder of
``*.pt.trace.json`` files opens in TensorBoard's profiler plugin), also merged into the
profiler's :class:`~cadence.profiler.JSONTraceHandler` files.
"""

from __future__ import annotations

import logging
import pathlib
import warnings
from typing import TYPE_CHECKING, Any, Optional, Sequence

from cadence.core import Callback
from cadence.profiler.profiler_action import ProfilerAction
from cadence.profiler.trace_handler import format_trace_name

if TYPE_CHECKING:
    from cadence.core import State

__all__ = ["TorchProfiler"]

log = logging.getLogger(__name__)

_ACTIVITIES = ("cpu", "cuda")


class TorchProfiler(Callback):
    """Records ``torch.profiler`` traces of the batches the run's profiler schedule marks.

    The schedule's actions map to torch's: ``SKIP`` -> none, ``WARMUP`` -> warm-up,
    ``ACTIVE`` -> record, ``ACTIVE_AND_SAVE`` -> record, then write the window at the
    batch's end. Profiling starts at ``FIT_START`` and stops at ``FIT_END`` (a window cut
    short by the end of training is written then). Added by
    :class:`~cadence.profiler.Profiler` (its ``torch_prof_*`` arguments), which it needs.

    Args:
        folder: where traces go; takes ``{run_name}``, ``{rank}``, ...
            (default ``'{run_name}/torch_traces'``).
        filename: each window's file; also takes ``{epoch}``, ``{batch}``, ...
            (default ``'rank{rank}.{batch}.pt.trace.json'``).
        remote_file_name: its upload name through the run's file destinations; ``None``:
            no upload.
        memory_filename: also write torch's memory timeline (HTML; needs ``matplotlib``,
            ``record_shapes``, ``profile_memory`` and ``with_stack``) per window; default
            ``None``: no.
        memory_remote_file_name: the memory timeline's upload name; ``None``: no upload.
        overwrite: allow replacing existing trace files (default False).
        use_gzip: gzip each trace (``.gz`` appended; the viewers open it as is).
        record_shapes: record operator input shapes (default False).
        profile_memory: record tensor allocations (default True).
        with_stack: record Python stacks (default False; costly).
        with_flops: estimate matmul/convolution FLOPs (default True).
        num_traces_to_keep: local trace files kept, the oldest deleted first; ``-1``: all.
        activities: cadence's addition: ``"cpu"`` and/or ``"cuda"``; default CPU, plus CUDA
            on a GPU run.

    Attributes:
        saved_traces: the paths of the traces this rank wrote, oldest first.

    Raises:
        ValueError: an unknown activity; ``memory_filename`` without ``record_shapes``,
            ``profile_memory`` and ``with_stack``; ``num_traces_to_keep`` below -1.
        FileExistsError: a trace file exists and ``overwrite`` is False.
        RuntimeError: the run has no profiler.
    """

    def __init__(
        self,
        folder: str = "{run_name}/torch_traces",
        filename: str = "rank{rank}.{batch}.pt.trace.json",
        remote_file_name: Optional[str] = "{run_name}/torch_traces/rank{rank}.{batch}.pt.trace.json",
        memory_filename: Optional[str] = None,
        memory_remote_file_name: Optional[str] = (
            "{run_name}/torch_memory_traces/rank{rank}.{batch}.pt.memory_trace.html"),
        overwrite: bool = False,
        use_gzip: bool = False,
        record_shapes: bool = False,
        profile_memory: bool = True,
        with_stack: bool = False,
        with_flops: bool = True,
        num_traces_to_keep: int = -1,
        *,
        activities: Optional[Sequence[str]] = None,
    ) -> None:
        if activities is not None and (not activities or any(a not in _ACTIVITIES
                                                             for a in activities)):
            raise ValueError(f"TorchProfiler activities={list(activities)!r}: each must be one "
                             f"of {', '.join(repr(a) for a in _ACTIVITIES)}.")
        if memory_filename is not None and not (record_shapes and profile_memory and with_stack):
            raise ValueError("TorchProfiler memory_filename needs record_shapes, profile_memory "
                             "and with_stack all True (torch's memory timeline reads them).")
        if num_traces_to_keep < -1:
            raise ValueError(f"TorchProfiler num_traces_to_keep must be -1 (all) or >= 0, got "
                             f"{num_traces_to_keep}.")
        self.folder = folder
        self.filename = filename
        self.remote_file_name = remote_file_name
        self.memory_filename = memory_filename
        self.memory_remote_file_name = memory_remote_file_name
        self.overwrite = overwrite
        self.use_gzip = use_gzip
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.with_stack = with_stack
        self.with_flops = with_flops
        self.num_traces_to_keep = num_traces_to_keep
        self.activities = None if activities is None else list(activities)
        self.saved_traces: list[pathlib.Path] = []
        self.profiler: Any = None
        self._state: Optional[State] = None
        self._logger: Any = None
        self._recorded = False  # a batch was recorded since the last write

    def _action(self) -> Any:
        """torch's action for the coming step, from the run's schedule now."""
        import torch.profiler as tp

        state = self._state
        assert state is not None and state.profiler is not None
        return {ProfilerAction.SKIP: tp.ProfilerAction.NONE,
                ProfilerAction.WARMUP: tp.ProfilerAction.WARMUP,
                ProfilerAction.ACTIVE: tp.ProfilerAction.RECORD,
                ProfilerAction.ACTIVE_AND_SAVE: tp.ProfilerAction.RECORD_AND_SAVE,
                }[ProfilerAction(state.profiler.schedule(state))]

    def _write(self, profiler: Any) -> None:
        state = self._state
        assert state is not None
        if not self._recorded:  # torch closes an empty window at the stop: nothing to write
            return
        self._recorded = False
        folder = pathlib.Path(format_trace_name(self.folder, state, with_time=False))
        path = folder / format_trace_name(self.filename, state)
        if self.use_gzip and path.suffix != ".gz":
            path = path.with_name(path.name + ".gz")  # export_chrome_trace gzips a .gz path
        if path.exists() and not self.overwrite:
            raise FileExistsError(f"TorchProfiler trace {path} exists; use another folder or "
                                  f"TorchProfiler(overwrite=True).")
        path.parent.mkdir(parents=True, exist_ok=True)
        profiler.export_chrome_trace(str(path))
        self.saved_traces.append(path)
        log.info("TorchProfiler: wrote %s", path)
        if self.remote_file_name is not None and self._logger is not None:
            name = format_trace_name(self.remote_file_name, state)
            self._logger.upload_file(name + (".gz" if path.suffix == ".gz" else ""), path,
                                     overwrite=self.overwrite)
        if self.memory_filename is not None:
            memory = folder / format_trace_name(self.memory_filename, state)
            profiler.export_memory_timeline(str(memory), device=str(state.device))
            if self.memory_remote_file_name is not None and self._logger is not None:
                self._logger.upload_file(format_trace_name(self.memory_remote_file_name, state),
                                         memory, overwrite=self.overwrite)
        assert state.profiler is not None
        state.profiler.record_chrome_json_trace_file(path)  # into the JSON trace handlers
        if self.num_traces_to_keep >= 0:
            while len(self.saved_traces) > self.num_traces_to_keep:
                self.saved_traces.pop(0).unlink(missing_ok=True)

    def fit_start(self, state: State, logger: Any) -> None:
        if state.profiler is None:
            raise RuntimeError("TorchProfiler needs the run's profiler: use "
                               "Trainer(profiler=Profiler(...)).")
        if self.profiler is not None:
            return
        import torch.profiler as tp

        self._state, self._logger = state, logger
        names = self.activities or (["cpu", "cuda"] if state.device.type == "cuda" else ["cpu"])
        self.profiler = tp.profile(
            activities=[tp.ProfilerActivity.CPU if n == "cpu" else tp.ProfilerActivity.CUDA
                        for n in names],
            schedule=lambda step: self._action(), on_trace_ready=self._write,
            record_shapes=self.record_shapes, profile_memory=self.profile_memory,
            with_stack=self.with_stack, with_flops=self.with_flops)
        self.profiler.start()

    def batch_start(self, state: State, logger: Any) -> None:
        del logger
        if self.profiler is not None and state.profiler is not None and state.profiler.schedule(
                state) in (ProfilerAction.ACTIVE, ProfilerAction.ACTIVE_AND_SAVE):
            self._recorded = True

    def batch_end(self, state: State, logger: Any) -> None:
        del state, logger
        if self.profiler is not None:
            with warnings.catch_warnings():
                # torch warns once that each window's events are cleared: that is the point
                warnings.filterwarnings("ignore", message=".*Profiler clears events",
                                        category=UserWarning)
                self.profiler.step()

    def _stop(self) -> None:
        if self.profiler is not None:
            profiler, self.profiler = self.profiler, None
            profiler.stop()  # writes a window cut short by the end of training

    def fit_end(self, state: State, logger: Any) -> None:
        del state, logger
        self._stop()

    def close(self, state: State, logger: Any) -> None:
        """Stop profiling (a fit that raised never reached ``FIT_END``); safe twice."""
        del state, logger
        self._stop()
