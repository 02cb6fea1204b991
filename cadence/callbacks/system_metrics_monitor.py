"""The :class:`SystemMetricsMonitor` callback: the host's CPU, memory, disk and network
figures (psutil) and, with ``pynvml``, each GPU's memory, utilisation, temperature and power.

Source: MosaicML Composer's ``SystemMetricsMonitor``
(``composer/callbacks/system_metrics_monitor.py``); psutil (https://psutil.readthedocs.io);
NVML through ``pynvml`` (``pip install 'cadence[system]'``, the ``nvidia-ml-py`` package).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Optional

import torch

from cadence.registry import callbacks
from cadence.core import Callback, Event
from cadence.utils import dist

if TYPE_CHECKING:
    from cadence.core import State

__all__ = ["SystemMetricsMonitor", "GPU_METRICS", "gpu_metrics", "host_metrics"]

log = logging.getLogger(__name__)

#: The per-GPU figures, reduced across ranks to their min and max (or kept per rank).
GPU_METRICS = ("memory_free_bytes", "memory_used_bytes", "gpu_percentage",
               "memory_percentage", "gpu_temperature_C", "gpu_power_usage_W")
_EVENTS = (Event.BATCH_START, Event.EVAL_BATCH_START, Event.PREDICT_BATCH_START)


def host_metrics() -> dict[str, float]:
    """This host's figures from psutil: ``cpu_percentage`` (all CPUs, since the previous
    call; 0.0 on the first), ``cpu_memory_<field>`` (``psutil.virtual_memory()``: bytes,
    ``percent``), ``disk_memory_<field>`` (``psutil.disk_usage`` of the root: bytes,
    ``percent``), ``network_<field>`` (``psutil.net_io_counters()``: bytes and packets since
    boot).

    Raises:
        ImportError: psutil is not installed (``pip install 'cadence[system]'``).
    """
    import psutil

    metrics: dict[str, float] = {"cpu_percentage": psutil.cpu_percent()}
    for prefix, values in (("cpu_memory", psutil.virtual_memory()),
                           ("disk_memory", psutil.disk_usage(os.sep)),
                           ("network", psutil.net_io_counters())):
        if values is not None:  # no network interface: None
            metrics.update({f"{prefix}_{k}": v for k, v in values._asdict().items()})
    return metrics


def gpu_metrics(index: int) -> dict[str, float]:
    """GPU ``index``'s NVML figures (:data:`GPU_METRICS`): memory free and used (bytes),
    utilisation of the GPU and of its memory (percent over the last sample period),
    temperature (degrees C), power draw (W). ``pynvml`` must be initialised."""
    import pynvml

    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
    return {
        "memory_free_bytes": memory.free, "memory_used_bytes": memory.used,
        "gpu_percentage": rates.gpu, "memory_percentage": rates.memory,
        "gpu_temperature_C": pynvml.nvmlDeviceGetTemperature(handle,
                                                             pynvml.NVML_TEMPERATURE_GPU),
        "gpu_power_usage_W": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,  # mW -> W
    }


@callbacks.register("system_metrics_monitor")
class SystemMetricsMonitor(Callback):
    """Logs system figures at every ``BATCH_START``, ``EVAL_BATCH_START`` and
    ``PREDICT_BATCH_START``.

    - Host (every run, psutil): :func:`host_metrics`, logged under their names
      (``cpu_percentage``, ``cpu_memory_used``, ``disk_memory_free``, ``network_bytes_sent``,
      ...); each rank's own host, so rank 0's reach the destinations that write on rank 0.
    - GPU (a CUDA run with ``pynvml`` installed): :func:`gpu_metrics` of each rank's GPU
      (its local rank's), gathered from all ranks; logged as ``min_<key>/Rank_<r>`` and
      ``max_<key>/Rank_<r>`` (the lowest and highest value and the rank it is on), or with
      ``log_all_data`` every rank's as ``Rank_<r>_<key>``. Without ``pynvml`` the GPU
      figures are left out, with one warning.

    Every rank must run it on a CUDA run (one ``all_gather_object`` per event).

    Args:
        log_all_data: log every rank's GPU figures instead of their min and max. Default
            False.

    Raises:
        ImportError: psutil is not installed (``pip install 'cadence[system]'``).
    """

    def __init__(self, log_all_data: bool = False) -> None:
        super().__init__()
        import psutil  # noqa: F401  (fail now, naming the package, not at the first batch)

        self.log_all_data = bool(log_all_data)
        self._nvml: Optional[bool] = None  # decided at the first event on a CUDA run

    def _gpu_ready(self, state: State) -> bool:
        if self._nvml is None:
            param = next(state.model.parameters(), None)
            self._nvml = False
            if param is not None and param.device.type == "cuda" and torch.cuda.is_available():
                try:
                    import pynvml

                    pynvml.nvmlInit()
                    self._nvml = True
                except ImportError:
                    log.warning("SystemMetricsMonitor: pynvml is not installed, so GPU figures "
                                "are left out (pip install 'cadence[system]').")
                except Exception as exc:  # NVMLError: no driver library, no permission
                    log.warning("SystemMetricsMonitor: NVML is unavailable (%s); GPU figures "
                                "are left out.", exc)
        return bool(self._nvml)

    def run_event(self, event: Event, state: State, logger: Any) -> None:
        if event not in _EVENTS:
            return
        metrics: dict[str, float] = dict(host_metrics())
        if self._gpu_ready(state):
            everyone = dist.all_gather_object(gpu_metrics(dist.get_local_rank()))
            metrics.update(self._gpu_summary(everyone))
        logger.log_metrics(metrics)

    def _gpu_summary(self, everyone: list[dict[str, float]]) -> dict[str, float]:
        """Per-rank GPU figures -> Composer's keys (min/max with their rank, or all)."""
        out: dict[str, float] = {}
        if self.log_all_data:
            for rank, figures in enumerate(everyone):
                out.update({f"Rank_{rank}_{key}": value for key, value in figures.items()})
            return out
        for key in GPU_METRICS:
            values = [figures[key] for figures in everyone]
            low = min(range(len(values)), key=values.__getitem__)
            high = max(range(len(values)), key=values.__getitem__)
            out[f"min_{key}/Rank_{low}"] = values[low]
            out[f"max_{key}/Rank_{high}"] = values[high]
        return out
