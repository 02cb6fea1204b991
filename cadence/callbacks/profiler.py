"""The :class:`ProfilerCallback`: cadence's one-object front on Composer's profiler, nameable
from a run file (``callbacks: {profiler: {...}}``).

It is a :class:`cadence.profiler.Profiler` with a :func:`~cadence.profiler.cyclic_schedule`
and a :class:`~cadence.profiler.TorchProfiler` built from flat arguments, and no system
counters or JSON trace handler: the same implementation as ``Trainer(profiler=Profiler(...))``,
not a second one. Source: PyTorch's ``torch.profiler``; argument names from MosaicML
Composer's ``cyclic_schedule`` and ``TorchProfiler``.
"""

from __future__ import annotations

import pathlib
from typing import TYPE_CHECKING, Any, Optional, Sequence

from cadence.registry import callbacks
from cadence.profiler.profiler import Profiler
from cadence.profiler.profiler_schedule import cyclic_schedule
from cadence.profiler.torch_profiler import TorchProfiler
from cadence.utils.dist import get_global_rank

if TYPE_CHECKING:
    from cadence.core import State

__all__ = ["ProfilerCallback", "TRACE_HANDLERS"]

#: What a finished profiling window is written as.
TRACE_HANDLERS = ("chrome", "tensorboard")
_ACTIVITIES = ("cpu", "cuda")
_TENSORBOARD_SUFFIX = ".pt.trace.json"  # what TensorBoard's profiler plugin looks for


def _non_negative_int(name: str, value: Any, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"ProfilerCallback {name} must be an integer >= {minimum} (batches), "
                         f"got {value!r}.")
    return value


@callbacks.register("profiler")
class ProfilerCallback(Profiler):
    """Profiles training batches with ``torch.profiler`` and writes one trace per window.

    The schedule is Composer's :func:`~cadence.profiler.cyclic_schedule`, counted within
    each epoch: skip ``skip_first`` batches, then ``repeat`` cycles (``0``: to the end of the
    epoch) of ``wait`` idle batches, ``warmup`` batches traced but discarded (the profiler's
    own start-up cost), and ``active`` batches recorded; it starts again each epoch. At the
    end of each cycle's last active batch (or of an epoch's last batch) the window is
    written, as a Chrome/Perfetto trace JSON (``trace_handler="chrome"``; open it in
    https://ui.perfetto.dev or ``chrome://tracing``) named by ``filename``, or for
    TensorBoard's profiler plugin (``trace_handler="tensorboard"``: the name ends in
    ``.pt.trace.json``; ``tensorboard --logdir <folder>`` with ``torch-tb-profiler``). A
    window cut short by the end of training is written when the fit ends.

    Only global rank zero profiles unless ``all_ranks=True``; each profiling rank writes
    its own files (``{rank}`` in ``filename``). Paths written are in :attr:`saved_traces`.
    For event durations and host counters in one JSON trace, use
    ``Trainer(profiler=Profiler(..., trace_handlers=[JSONTraceHandler(...)]))``.

    Args:
        skip_first: batches to skip at the start of each epoch (default 0).
        wait: idle batches at the start of each cycle (default 0).
        warmup: traced-but-discarded batches before the active ones (default 1).
        active: batches recorded per cycle (default 4).
        repeat: cycles per epoch; ``0`` repeats until the epoch ends (default 1).
        folder: where traces go; may contain ``{run_name}``. Default: ``<save_folder>/
            torch_traces`` if the run has a ``save_folder``, else ``runs/{run_name}/
            torch_traces``. Created if missing.
        filename: a trace's file name; may contain ``{run_name}``, ``{rank}``, ``{batch}``
            (the last recorded batch) and ``{epoch}``. Default
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
        counts = {"skip_first": skip_first, "wait": wait, "warmup": warmup, "repeat": repeat}
        counts = {name: _non_negative_int(name, value) for name, value in counts.items()}
        active = _non_negative_int("active", active, minimum=1)
        if trace_handler not in TRACE_HANDLERS:
            raise ValueError(f"ProfilerCallback trace_handler={trace_handler!r} is not one of "
                             f"{', '.join(repr(h) for h in TRACE_HANDLERS)}.")
        if activities is not None and (not activities
                                       or any(a not in _ACTIVITIES for a in activities)):
            raise ValueError(f"ProfilerCallback activities={list(activities)!r}: each must "
                             f"be one of {', '.join(repr(a) for a in _ACTIVITIES)}.")
        if trace_handler == "tensorboard" and not filename.endswith(_TENSORBOARD_SUFFIX):
            filename += _TENSORBOARD_SUFFIX
        super().__init__(
            schedule=cyclic_schedule(active=active, **counts), trace_handlers=[],
            sys_prof_cpu=False, torch_prof_record_shapes=False, torch_prof_profile_memory=False,
            torch_prof_with_stack=False, torch_prof_with_flops=False)  # our TorchProfiler below
        self.skip_first, self.wait, self.warmup = skip_first, wait, warmup
        self.active, self.repeat = active, repeat
        self.folder = folder
        self.filename = filename
        self.trace_handler = trace_handler
        self.activities = None if activities is None else list(activities)
        self.all_ranks = all_ranks
        self.torch_profiler = TorchProfiler(
            folder=folder or "", filename=filename, remote_file_name=None, overwrite=True,
            use_gzip=use_gzip, record_shapes=record_shapes, profile_memory=profile_memory,
            with_stack=with_stack, with_flops=with_flops, activities=activities)

    @property
    def saved_traces(self) -> list[pathlib.Path]:
        """The traces this rank wrote, oldest first."""
        return self.torch_profiler.saved_traces

    def bind_to_state(self, state: State) -> None:
        """Bind as a :class:`~cadence.profiler.Profiler`; the torch profiler runs on global
        rank zero only unless ``all_ranks``."""
        if self.all_ranks or get_global_rank() == 0:
            if self.torch_profiler not in self._callbacks:
                self._callbacks.append(self.torch_profiler)
        super().bind_to_state(state)

    def fit_start(self, state: State, logger: Any) -> None:
        """Settle the default folder (runs before the torch profiler's ``FIT_START``)."""
        del logger
        if self.folder is not None:
            return
        base = (pathlib.Path(str(state.save_folder)) if state.save_folder is not None
                else pathlib.Path("runs") / state.run_name)
        self.torch_profiler.folder = str(base / "torch_traces").replace("{", "{{").replace(
            "}", "}}")
