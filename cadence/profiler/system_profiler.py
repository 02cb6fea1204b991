"""The :class:`SystemProfiler`: host CPU, memory, disk and network counters in the traces.

Source: MosaicML Composer's ``composer.profiler.SystemProfiler`` (same arguments), over
``psutil``.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Optional, Union

from cadence.core import Callback

if TYPE_CHECKING:
    from cadence.core import State

__all__ = ["SystemProfiler"]


def _counters(profile_cpu: bool, profile_memory: bool, profile_disk: bool,
              profile_net: bool) -> dict[str, dict[str, Union[int, float]]]:
    """One sample of each asked-for group: ``{marker name: {counter: value}}``."""
    import psutil

    values: dict[str, dict[str, Union[int, float]]] = {}
    if profile_cpu:
        values["cpu"] = {f"cpu{i}_percent": p
                         for i, p in enumerate(psutil.cpu_percent(percpu=True))}
        values["cpu"]["percent"] = psutil.cpu_percent()
    if profile_memory:
        memory = psutil.virtual_memory()
        values["memory"] = {"used_bytes": memory.used, "available_bytes": memory.available,
                            "percent": memory.percent}
        swap = psutil.swap_memory()
        values["swap_memory"] = {"used_bytes": swap.used, "percent": swap.percent}
    if profile_disk:
        disk = psutil.disk_io_counters()
        if disk is not None:
            values["disk"] = {"read_bytes": disk.read_bytes, "write_bytes": disk.write_bytes,
                              "read_count": disk.read_count, "write_count": disk.write_count}
    if profile_net:
        net = psutil.net_io_counters()
        values["network"] = {"bytes_sent": net.bytes_sent, "bytes_recv": net.bytes_recv,
                             "packets_sent": net.packets_sent,
                             "packets_recv": net.packets_recv}
    return values


class SystemProfiler(Callback):
    """Samples host counters with ``psutil`` in a background thread every
    ``stats_thread_interval_seconds`` from ``FIT_START`` to ``FIT_END`` and records them as
    counter events (``marker.counter``, category ``system``) of the run's profiler, which
    writes them only on the batches its schedule records. Added by
    :class:`~cadence.profiler.Profiler` (its ``sys_prof_*`` arguments).

    Args:
        profile_cpu: per-CPU and total utilisation, percent (default True).
        profile_memory: virtual and swap memory, bytes and percent (default False).
        profile_disk: disk reads and writes since boot, bytes and counts (default False).
        profile_net: network bytes and packets since boot (default False).
        stats_thread_interval_seconds: seconds between samples (default 0.5).

    Raises:
        ValueError: a non-positive interval.
        RuntimeError: the run has no profiler.
    """

    def __init__(self, profile_cpu: bool = True, profile_memory: bool = False,
                 profile_disk: bool = False, profile_net: bool = False,
                 stats_thread_interval_seconds: float = 0.5) -> None:
        if not stats_thread_interval_seconds > 0:
            raise ValueError(f"SystemProfiler stats_thread_interval_seconds must be > 0, got "
                             f"{stats_thread_interval_seconds!r}.")
        self.profile_cpu = profile_cpu
        self.profile_memory = profile_memory
        self.profile_disk = profile_disk
        self.profile_net = profile_net
        self.stats_thread_interval_seconds = stats_thread_interval_seconds
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _sample(self, state: State) -> None:
        profiler = state.profiler
        assert profiler is not None
        while not self._stop.is_set():
            for name, values in _counters(self.profile_cpu, self.profile_memory,
                                          self.profile_disk, self.profile_net).items():
                profiler.marker(f"system/{name}", categories=["system"]).counter(values)
            self._stop.wait(self.stats_thread_interval_seconds)

    def fit_start(self, state: State, logger: Any) -> None:
        del logger
        if state.profiler is None:
            raise RuntimeError("SystemProfiler needs the run's profiler: use "
                               "Trainer(profiler=Profiler(...)).")
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._sample, args=(state,), daemon=True,
                                            name="cadence-system-profiler")
            self._thread.start()

    def _join(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def fit_end(self, state: State, logger: Any) -> None:
        del state, logger
        self._join()

    def close(self, state: State, logger: Any) -> None:
        """Stop the sampling thread (safe twice)."""
        del state, logger
        self._join()
