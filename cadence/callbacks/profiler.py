"""The :class:`ProfilerCallback`: ``torch.profiler`` over a schedule of training batches.

Source: PyTorch's ``torch.profiler.profile`` and ``torch.profiler.schedule``; argument names
from MosaicML Composer's profiler (``composer/profiler``: ``cyclic_schedule(skip_first, wait,
warmup, active, repeat)`` and ``TorchProfiler(folder, filename, record_shapes,
profile_memory, with_stack, with_flops, use_gzip)``), as one callback instead of Composer's
``Profiler`` object plus trace handlers.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

from cadence.core import Callback
from cadence.utils.dist import get_global_rank
from cadence.config.registry import callbacks

if TYPE_CHECKING:
    from cadence.core import State

__all__ = ["ProfilerCallback", "TRACE_HANDLERS"]

log = logging.getLogger(__name__)

#: What a finished profiling window is written as.
TRACE_HANDLERS = ("chrome", "tensorboard")
_ACTIVITIES = ("cpu", "cuda")


def _non_negative_int(name: str, value: Any, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"ProfilerCallback {name} must be an integer >= {minimum} (batches), "
                         f"got {value!r}.")
    return value


@callbacks.register("profiler")
class ProfilerCallback(Callback):
    """Profiles training batches with ``torch.profiler`` and writes one trace per window.

    The schedule counts training batches from ``FIT_START`` (``torch.profiler.schedule``):
    skip ``skip_first`` batches, then ``repeat`` cycles (``0``: until training ends) of
    ``wait`` idle batches, ``warmup`` batches traced but discarded (the profiler's own
    start-up cost), and ``active`` batches recorded. At the end of each cycle's active
    batches the trace is written: as a Chrome/Perfetto trace JSON
    (``trace_handler="chrome"``; open it in https://ui.perfetto.dev or
    ``chrome://tracing``) named by ``filename``, or in TensorBoard's profiler-plugin layout
    (``trace_handler="tensorboard"``: ``<folder>/<worker>.<time>.pt.trace.json``, viewed with
    ``tensorboard --logdir <folder>`` and the ``torch-tb-profiler`` plugin). A window cut
    short by the end of training is written when the fit ends.

    Only global rank zero profiles unless ``all_ranks=True``; each profiling rank writes
    its own files (``{rank}`` in ``filename``). Paths written are in :attr:`saved_traces`.

    Args:
        skip_first: batches to skip before the first cycle (default 0).
        wait: idle batches at the start of each cycle (default 0).
        warmup: traced-but-discarded batches before the active ones (default 1).
        active: batches recorded per cycle (default 4).
        repeat: cycles; ``0`` repeats until training ends (default 1).
        folder: where traces go; may contain ``{run_name}``. Default: ``<save_folder>/
            torch_traces`` if the run has a ``save_folder``, else ``runs/{run_name}/
            torch_traces``. Created if missing.
        filename: a Chrome trace's file name; may contain ``{run_name}``, ``{rank}``,
            ``{batch}`` (the last recorded batch) and ``{epoch}``. Default
            ``rank{rank}.{batch}.pt.trace.json`` (Composer's).
        trace_handler: ``"chrome"`` (default) or ``"tensorboard"``.
        activities: what to record, ``"cpu"`` and/or ``"cuda"``; default CPU, plus CUDA
            when the run's device is a GPU.
        record_shapes: record operator input shapes (default ``False``).
        profile_memory: record tensor allocations and frees (default ``False``).
        with_stack: record Python stack traces (default ``False``; costly).
        with_flops: estimate FLOPs of matmuls and convolutions (default ``False``).
        all_ranks: profile every rank, not only global rank zero (default ``False``).
        use_gzip: gzip each trace (``.json.gz``; Perfetto opens it as is).

    Raises:
        ValueError: a schedule value is not a non-negative integer (``active`` must be at
            least 1), an unknown ``trace_handler`` or activity.

    Example (YAML)::

        callbacks:
          profiler: {skip_first: 10, warmup: 1, active: 3, record_shapes: true}
    """

    def __init__(
        self,
        skip_first: int = 0,
        wait: int = 0,
        warmup: int = 1,
        active: int = 4,
        repeat: int = 1,
        folder: Optional[str] = None,
        filename: str = "rank{rank}.{batch}.pt.trace.json",
        trace_handler: str = "chrome",
        activities: Optional[Sequence[str]] = None,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
        with_flops: bool = False,
        all_ranks: bool = False,
        use_gzip: bool = False,
    ) -> None:
        self.skip_first = _non_negative_int("skip_first", skip_first)
        self.wait = _non_negative_int("wait", wait)
        self.warmup = _non_negative_int("warmup", warmup)
        self.active = _non_negative_int("active", active, minimum=1)
        self.repeat = _non_negative_int("repeat", repeat)
        if trace_handler not in TRACE_HANDLERS:
            raise ValueError(f"ProfilerCallback trace_handler={trace_handler!r} is not one of "
                             f"{', '.join(repr(h) for h in TRACE_HANDLERS)}.")
        if activities is not None:
            unknown = [a for a in activities if a not in _ACTIVITIES]
            if unknown or not activities:
                raise ValueError(f"ProfilerCallback activities={list(activities)!r}: each must "
                                 f"be one of {', '.join(repr(a) for a in _ACTIVITIES)}.")
        self.folder = folder
        self.filename = filename
        self.trace_handler = trace_handler
        self.activities = None if activities is None else list(activities)
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.with_stack = with_stack
        self.with_flops = with_flops
        self.all_ranks = all_ranks
        self.use_gzip = use_gzip
        self.saved_traces: list[Path] = []
        self._profiler: Any = None
        self._state: Optional[State] = None

    # -- helpers --------------------------------------------------------------------------
    def _trace_folder(self, state: State) -> Path:
        if self.folder is not None:
            return Path(self.folder.format(run_name=state.run_name))
        if state.save_folder is not None:
            return Path(str(state.save_folder)) / "torch_traces"
        return Path("runs") / state.run_name / "torch_traces"

    def _write_chrome_trace(self, profiler: Any) -> None:
        state = self._state
        assert state is not None
        name = self.filename.format(run_name=state.run_name, rank=get_global_rank(),
                                    batch=int(state.timestamp.batch),
                                    epoch=int(state.timestamp.epoch))
        if self.use_gzip and not name.endswith(".gz"):
            name += ".gz"  # export_chrome_trace gzips a path ending in .gz
        path = self._trace_folder(state) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        profiler.export_chrome_trace(str(path))
        self.saved_traces.append(path)
        log.info("ProfilerCallback: wrote %s", path)

    def _build(self, state: State) -> Any:
        import torch.profiler as tp

        names = self.activities or (["cpu", "cuda"] if state.device.type == "cuda" else ["cpu"])
        activities = [tp.ProfilerActivity.CPU if n == "cpu" else tp.ProfilerActivity.CUDA
                      for n in names]
        folder = self._trace_folder(state)
        if self.trace_handler == "tensorboard":
            folder.mkdir(parents=True, exist_ok=True)
            tensorboard = tp.tensorboard_trace_handler(
                str(folder), worker_name=f"rank{get_global_rank()}", use_gzip=self.use_gzip)

            def on_trace_ready(profiler: Any) -> None:
                before = set(folder.iterdir())
                tensorboard(profiler)
                self.saved_traces.extend(sorted(set(folder.iterdir()) - before))
        else:
            on_trace_ready = self._write_chrome_trace
        return tp.profile(
            activities=activities,
            schedule=tp.schedule(skip_first=self.skip_first, wait=self.wait,
                                 warmup=self.warmup, active=self.active, repeat=self.repeat),
            on_trace_ready=on_trace_ready, record_shapes=self.record_shapes,
            profile_memory=self.profile_memory, with_stack=self.with_stack,
            with_flops=self.with_flops)

    def _stop(self) -> None:
        if self._profiler is not None:
            profiler, self._profiler = self._profiler, None
            profiler.stop()  # writes a window cut short by the end of training

    # -- events ---------------------------------------------------------------------------
    def fit_start(self, state: State, logger: Any) -> None:
        del logger
        if self._profiler is not None or not (self.all_ranks or get_global_rank() == 0):
            return
        self._state = state
        self._profiler = self._build(state)
        self._profiler.start()

    def batch_end(self, state: State, logger: Any) -> None:
        del state, logger
        if self._profiler is not None:
            with warnings.catch_warnings():
                # torch warns, once, at the second cycle that each cycle's events are
                # cleared: that is the point here (one trace per cycle, not cumulative).
                warnings.filterwarnings("ignore", message=".*Profiler clears events",
                                        category=UserWarning)
                self._profiler.step()

    def fit_end(self, state: State, logger: Any) -> None:
        del state, logger
        self._stop()

    def close(self) -> None:
        """Stop profiling (a fit that raised never reached ``FIT_END``). Safe to call twice."""
        self._stop()
