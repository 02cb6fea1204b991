"""The :class:`MemoryMonitor` callback: device and host memory use during training.

Source: MosaicML Composer's ``MemoryMonitor`` (``composer/callbacks/memory_monitor.py``),
which reads ``torch.cuda.memory_stats()``; the host figures come from ``/proc/self/statm``
and ``resource.getrusage``.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any, Optional, Union

import torch

from cadence.core import Callback, Time, TimeUnit
from cadence.registry import callbacks

if TYPE_CHECKING:
    from cadence.core import State

__all__ = ["MemoryMonitor", "cuda_memory_report", "host_memory_report"]

log = logging.getLogger(__name__)

# torch.cuda.memory_stats() key -> the metric name it is logged under (memory/<name>).
_CUDA_KEYS = {
    "allocated_bytes.all.current": "allocated_mem",
    "reserved_bytes.all.current": "reserved_mem",
    "allocated_bytes.all.peak": "peak_allocated_mem",
    "reserved_bytes.all.peak": "peak_reserved_mem",
    "num_alloc_retries": "num_alloc_retries",
    "num_ooms": "num_ooms",
}


def cuda_memory_report(device: Union[torch.device, int, None] = None,
                       memory_keys: Optional[dict[str, str]] = None) -> dict[str, int]:
    """The CUDA caching allocator's figures for ``device``, from ``torch.cuda.memory_stats``.

    Reading them is host-side bookkeeping: no device synchronisation.

    Args:
        device: the CUDA device; default the current one.
        memory_keys: ``{torch.cuda.memory_stats key: metric name}`` to report instead of the
            default keys below.

    Returns:
        ``allocated_mem``, ``reserved_mem``, ``peak_allocated_mem``, ``peak_reserved_mem``
        (bytes; peaks since the process started or since ``torch.cuda.reset_peak_memory_stats``),
        ``num_alloc_retries`` and ``num_ooms`` (counts since the process started). Empty when
        CUDA is not available or the allocator has not been used.
    """
    if not torch.cuda.is_available():
        return {}
    stats = torch.cuda.memory_stats(device)
    keys = _CUDA_KEYS if memory_keys is None else memory_keys
    return {name: int(stats[key]) for key, name in keys.items() if key in stats}


def _statm_rss_bytes() -> Optional[int]:
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            resident_pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None  # not Linux (no /proc)
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def _peak_rss_bytes() -> Optional[int]:
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # ru_maxrss is in KiB on Linux and the BSDs, in bytes on macOS.
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def host_memory_report() -> dict[str, int]:
    """This process's resident set size (RSS), in bytes.

    Returns:
        ``rss_bytes``: resident memory now (from ``/proc/self/statm``; Linux only), and
        ``peak_rss_bytes``: the most resident memory since the process started (from
        ``resource.getrusage``; not on Windows). A key is left out where the platform
        cannot give it.
    """
    report: dict[str, int] = {}
    rss = _statm_rss_bytes()
    if rss is not None:
        report["rss_bytes"] = rss
    peak = _peak_rss_bytes()
    if peak is not None:
        report["peak_rss_bytes"] = max(peak, rss or 0)
    return report


@callbacks.register("memory_monitor")
class MemoryMonitor(Callback):
    """Logs memory use at ``BATCH_END`` on the first step and every ``log_interval`` steps.

    Metrics (all memory in **bytes**, counts as integers; each rank reports its own, and
    destinations that write on rank zero only show rank zero's):

    - on a CUDA run (``state.device`` is CUDA), from ``torch.cuda.memory_stats``:
      ``memory/allocated_mem``, ``memory/reserved_mem`` (now), ``memory/peak_allocated_mem``,
      ``memory/peak_reserved_mem`` (since the process started), ``memory/num_alloc_retries``
      and ``memory/num_ooms`` (totals);
    - on every run, the process's resident memory: ``memory/rss_bytes`` (now; Linux) and
      ``memory/peak_rss_bytes`` (the high-water mark).

    Allocator retries: when the CUDA caching allocator cannot find a free block it frees
    its whole cache and retries ``cudaMalloc``. That synchronises the device and, when it
    happens every step, costs about a quarter of the throughput while the run still looks
    healthy. So on a CUDA run the retry count is read at every ``BATCH_END`` (host-side,
    no device sync), and when it has grown since the last batch a warning is logged (via
    :mod:`logging`, at most once per ``retry_warning_interval`` batches) suggesting a smaller
    ``device_train_microbatch_size``.

    Reading the figures does not synchronise the device.

    Args:
        memory_keys: Composer's argument: ``{torch.cuda.memory_stats key: metric name}``
            logged on CUDA runs instead of the default keys above; default ``None``.
        dist_aggregate_batch_interval: Composer's argument: every this many batches also log
            ``memory/<name>_avg``, ``_min`` and ``_max`` over all ranks (three all-reduces);
            default ``None`` (never).
        log_interval: log every this many batches (an ``int`` or ``"10ba"``), plus the first;
            default 10, the Trainer's default ``log_interval``, so memory is logged at the
            same steps as the loss.
        retry_warning_interval: at most one allocator-retry warning per this many batches
            (default 100).

    Raises:
        ValueError: ``log_interval``, ``retry_warning_interval`` or
            ``dist_aggregate_batch_interval`` is not a positive number of batches;
            ``memory_keys`` is not a mapping of strings.

    Unlike Composer (every batch, at ``AFTER_TRAIN_BATCH``), the report is taken at
    ``BATCH_END`` every ``log_interval`` batches, so the metric files stay the size of the loss's.
    """

    def __init__(self, memory_keys: Optional[dict[str, str]] = None,
                 dist_aggregate_batch_interval: Optional[int] = None,
                 log_interval: Union[int, str, Time] = 10,
                 retry_warning_interval: int = 100) -> None:
        if memory_keys is not None and not (
                isinstance(memory_keys, dict)
                and all(isinstance(k, str) and isinstance(v, str) for k, v in memory_keys.items())):
            raise ValueError(f"MemoryMonitor memory_keys must map torch.cuda.memory_stats keys to "
                             f"metric names (str -> str), got {memory_keys!r}.")
        if dist_aggregate_batch_interval is not None and (
                isinstance(dist_aggregate_batch_interval, bool)
                or not isinstance(dist_aggregate_batch_interval, int)
                or dist_aggregate_batch_interval < 1):
            raise ValueError(f"MemoryMonitor dist_aggregate_batch_interval must be an int >= 1 or "
                             f"None, got {dist_aggregate_batch_interval!r}.")
        self.memory_keys = memory_keys
        self.dist_aggregate_batch_interval = dist_aggregate_batch_interval
        interval = Time.from_input(log_interval, TimeUnit.BATCH)
        if interval.unit != TimeUnit.BATCH or interval.value < 1:
            raise ValueError(
                f"MemoryMonitor log_interval must be a positive number of batches (e.g. 10 or "
                f"'10ba'); got {log_interval!r}."
            )
        if int(retry_warning_interval) != retry_warning_interval or retry_warning_interval < 1:
            raise ValueError(
                f"MemoryMonitor retry_warning_interval must be an integer >= 1, got "
                f"{retry_warning_interval!r}."
            )
        self.log_interval = int(interval.value)
        self.retry_warning_interval = int(retry_warning_interval)
        self._last_retries: Optional[int] = None
        self._last_warned_batch: Optional[int] = None

    def fit_start(self, state: State, logger: Any) -> None:
        del logger
        self._last_retries = self._retries(state)

    @staticmethod
    def _retries(state: State) -> Optional[int]:
        if state.device.type != "cuda" or not torch.cuda.is_available():
            return None
        return int(torch.cuda.memory_stats(state.device).get("num_alloc_retries", 0))

    def _check_retries(self, state: State) -> None:
        retries = self._retries(state)
        if retries is None:
            return
        previous, self._last_retries = self._last_retries, retries
        if previous is None or retries <= previous:
            return
        step = int(state.timestamp.batch)
        if (self._last_warned_batch is not None
                and step - self._last_warned_batch < self.retry_warning_interval):
            return
        self._last_warned_batch = step
        size = state.device_train_microbatch_size
        log.warning(
            "CUDA allocator retries: memory/num_alloc_retries rose from %d to %d during batch "
            "%d on %s. The caching allocator ran out of free blocks, flushed its cache and "
            "retried cudaMalloc, which synchronises the device; when this happens every step "
            "it costs about 25%% of throughput. Lower device_train_microbatch_size (now %s) "
            "and/or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True. (Shown at most once "
            "every %d batches.)",
            previous, retries, step, state.device, size if size is not None else "the whole batch",
            self.retry_warning_interval,
        )

    def batch_end(self, state: State, logger: Any) -> None:
        self._check_retries(state)
        step = int(state.timestamp.batch)
        if step != 1 and step % self.log_interval != 0:
            return
        report: dict[str, Any] = {}
        if state.device.type == "cuda":
            report.update(cuda_memory_report(state.device, self.memory_keys))
        report.update(host_memory_report())
        interval = self.dist_aggregate_batch_interval
        if interval is not None and step % interval == 0:
            report.update(_over_ranks(report, state.device))
        if report:
            logger.log_metrics({f"memory/{name}": value for name, value in report.items()})


def _over_ranks(report: dict[str, Any], device: torch.device) -> dict[str, float]:
    """``<name>_avg``, ``_min``, ``_max`` of each figure over all ranks (one all-reduce each;
    every rank must report the same names, which it does on one kind of device)."""
    from cadence.utils import dist

    names = sorted(report)
    values = torch.tensor([float(report[name]) for name in names], dtype=torch.float64,
                          device=device)
    out: dict[str, float] = {}
    for suffix, op in (("avg", "sum"), ("min", "min"), ("max", "max")):
        reduced = values.clone()
        dist.all_reduce(reduced, op)
        if suffix == "avg":
            reduced /= dist.get_world_size()
        out.update({f"{name}_{suffix}": float(v) for name, v in zip(names, reduced.tolist())})
    return out
