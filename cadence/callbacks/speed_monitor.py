"""The :class:`SpeedMonitor` callback: throughput, model FLOPs utilisation and wall-clock time.

Source: MosaicML Composer's ``SpeedMonitor`` (``composer/callbacks/speed_monitor.py``): the
same metric names, ``time_unit`` and ``gpu_flops_available``; FLOPs summed over ranks as
Lightning's ``Throughput`` does (``lightning/fabric/utilities/throughput.py``).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Optional, Union

from cadence.callbacks.eval_clock import EvalClockCallback
from cadence.utils.dist import get_world_size
from cadence.utils.misc import unwrap_model
from cadence.registry import callbacks
from cadence.utils.flops import PEAK_FLOPS, device_peak_flops

if TYPE_CHECKING:
    from cadence.core import State

__all__ = ["SpeedMonitor", "TIME_UNITS"]

log = logging.getLogger(__name__)


def _composer_flops_table() -> dict[str, dict[str, float]]:
    """:data:`cadence.utils.flops.PEAK_FLOPS` in Composer's shape: also keyed by the
    Trainer's precisions (``amp_bf16``, ``amp_fp16``, ``amp_fp8``), and with Composer's
    ``h200-sxm`` for cadence's ``h200``."""
    table = {}
    for device, rates in PEAK_FLOPS.items():
        row = dict(rates)
        for low in ("bf16", "fp16", "fp8"):
            if low in rates:
                row[f"amp_{low}"] = rates[low]
        table[device] = row
    table["h200-sxm"] = table["h200"]
    return table


#: Composer's ``GPU_AVAILABLE_FLOPS``: dense peak FLOP/s by device and precision
#: (``GPU_AVAILABLE_FLOPS['a100']['amp_bf16']``), from :data:`~cadence.utils.flops.PEAK_FLOPS`.
GPU_AVAILABLE_FLOPS: dict[str, dict[str, float]] = _composer_flops_table()

#: Seconds in each ``time_unit`` the ``time/*`` metrics can be logged in.
TIME_UNITS = {"seconds": 1.0, "minutes": 60.0, "hours": 3600.0, "days": 86400.0}


class _Point(NamedTuple):
    train_seconds: float
    batch: int
    sample: int
    token: int
    flops: float  # this rank's model FLOPs so far in this fit


@callbacks.register("speed_monitor")
class SpeedMonitor(EvalClockCallback):
    """Logs throughput, model FLOPs utilisation (MFU) and the time spent training.

    Time is host wall-clock time (``time.perf_counter``) read at each ``BATCH_END``; no CUDA
    synchronisation is forced, so with an asynchronous device the figures settle once the
    host waits on the device (which it does at least every time a loss is read). Time spent
    in evaluation (``EVAL_BEFORE_ALL`` .. ``EVAL_AFTER_ALL``, or ``EVAL_START`` ..
    ``EVAL_END`` when fired alone) is left out of every figure.

    At every ``BATCH_END`` after the first of a ``fit`` it logs, over the last
    ``window_size`` batches (fewer until that many have run, where Composer waits for a
    full window; the first batch's own time, which includes warm-up, is never counted):

    =====================================  ==============================================
    ``throughput/batches_per_sec``          optimizer steps per second
    ``throughput/samples_per_sec``          samples per second, all ranks together
    ``throughput/tokens_per_sec``           tokens per second, all ranks together; only
                                            when the run counts tokens
    ``throughput/flops_per_sec``            model FLOPs per second, all ranks together;
                                            only when the model has ``flops_per_batch``
    ``throughput/device/<name>_per_sec``    each of the above divided by the world size
    ``throughput/device/mfu``               ``throughput/device/flops_per_sec`` / the
                                            device's peak FLOP/s, when the peak is known
    =====================================  ==============================================

    and at every ``BATCH_END``, in ``time_unit``:

    - ``time/train``: time spent training so far (since ``FIT_START``, eval excluded;
      carried across checkpoint resumption through :meth:`state_dict`).
    - ``time/val``: time spent in evaluation so far.
    - ``time/total``: their sum.

    **FLOPs.** The model's ``flops_per_batch(batch)`` (on the model or, under DDP, the
    wrapped module; :meth:`~cadence.models.HuggingFaceModel.flops_per_batch` gives the PaLM
    count for transformers) is called on each rank's own batch at ``BATCH_END``; the
    all-ranks figure is that times the world size (ranks see batches of one shape; Composer
    all-reduces instead, a collective every batch). **Peak.** ``peak_flops`` when given;
    otherwise, on a CUDA device, the dense peak for the device's name and the run's
    precision from :data:`cadence.utils.flops.PEAK_FLOPS` (``fp32`` counts as ``tf32``
    when PyTorch allows TF32 matmuls). On a CPU, or a GPU not in the table, there is no MFU
    unless ``peak_flops`` is given (an unknown GPU is reported once in the log).

    Args:
        window_size: batches to average throughput over (default 20).
        peak_flops: the peak FLOP/s of one device (e.g. ``989.4e12`` for an H100 SXM in
            bf16; a CPU's is cores x clock x FLOPs per cycle); default: from the table.
        gpu_flops_available: Composer's name for ``peak_flops`` (give one of the two).
        time_unit: unit of the ``time/*`` metrics: ``"seconds"``, ``"minutes"``,
            ``"hours"`` (default, as Composer) or ``"days"``.

    Raises:
        ValueError: ``window_size`` is less than 1, ``peak_flops`` is not a positive
            number or is given twice, or ``time_unit`` is unknown.
        TypeError: the model's ``flops_per_batch`` is not callable (at the first batch).

    Example (YAML)::

        callbacks:
          speed_monitor: {window_size: 20, peak_flops: 1.66e11}
    """

    def __init__(
        self,
        window_size: int = 20,
        peak_flops: Optional[float] = None,
        gpu_flops_available: Optional[float] = None,
        time_unit: str = "hours",
    ) -> None:
        super().__init__()
        if int(window_size) != window_size or window_size < 1:
            raise ValueError(
                f"SpeedMonitor window_size must be an integer >= 1, got {window_size!r}."
            )
        if peak_flops is not None and gpu_flops_available is not None:
            raise ValueError("SpeedMonitor: give peak_flops or gpu_flops_available (Composer's "
                             "name for it), not both.")
        peak = peak_flops if peak_flops is not None else gpu_flops_available
        if peak is not None and (isinstance(peak, bool) or not isinstance(peak, (int, float))
                                 or not peak > 0):
            raise ValueError(f"SpeedMonitor peak_flops must be a positive number of FLOP/s per "
                             f"device (e.g. 989.4e12), got {peak!r}.")
        if time_unit not in TIME_UNITS:
            raise ValueError(f"SpeedMonitor time_unit={time_unit!r} is not one of "
                             f"{', '.join(repr(u) for u in TIME_UNITS)}.")
        self.window_size = int(window_size)
        self.peak_flops: Optional[float] = None if peak is None else float(peak)
        self.time_unit = time_unit
        self._divider = TIME_UNITS[time_unit]
        # window_size batches elapse between window_size + 1 points.
        self._history: deque[_Point] = deque(maxlen=self.window_size + 1)
        self._flops_so_far = 0.0
        self._device_peak: Optional[float] = None
        self._peak_resolved = False
        self._train_offset = 0.0  # training seconds from earlier fits / a checkpoint
        self._fit_started_at: Optional[float] = None
        self._eval_seconds_at_fit_start = 0.0

    # -- Composer's window, per batch ------------------------------------------------------
    def _deltas(self, field: str) -> deque[Union[int, float]]:
        values = [getattr(p, field) for p in self._history]
        return deque((b - a for a, b in zip(values, values[1:])), maxlen=self.window_size)

    @property
    def history_samples(self) -> deque[Union[int, float]]:
        """Samples of each batch in the window (Composer's attribute; up to
        ``window_size`` entries, newest last; the first batch of a fit is not in it)."""
        return self._deltas("sample")

    @property
    def history_tokens(self) -> deque[Union[int, float]]:
        """Tokens of each batch in the window (Composer's attribute)."""
        return self._deltas("token")

    @property
    def history_wct(self) -> deque[Union[int, float]]:
        """Training seconds of each batch in the window (Composer's attribute)."""
        return self._deltas("train_seconds")

    @property
    def history_flops(self) -> deque[Union[int, float]]:
        """This rank's model FLOPs of each batch in the window (Composer's attribute)."""
        return self._deltas("flops")

    # -- clock ----------------------------------------------------------------------------
    def _train_seconds(self, now: float) -> float:
        if self._fit_started_at is None:
            return self._train_offset
        eval_in_fit = self.eval_seconds_now(now) - self._eval_seconds_at_fit_start
        return self._train_offset + (now - self._fit_started_at) - eval_in_fit

    def _start_fit_clock(self) -> None:
        self._fit_started_at = time.perf_counter()
        self._eval_seconds_at_fit_start = self._eval_seconds
        self._history.clear()
        self._flops_so_far = 0.0

    # -- FLOPs ----------------------------------------------------------------------------
    def _batch_flops(self, state: State) -> Optional[float]:
        """This rank's model FLOPs for the batch just trained, or ``None`` (no counter)."""
        counter: Optional[Callable[[Any], Any]] = getattr(
            unwrap_model(state.model), "flops_per_batch", None)
        if counter is None:
            return None
        if not callable(counter):
            raise TypeError(f"The model's flops_per_batch must be a callable taking a batch and "
                            f"returning its FLOPs, got {type(counter).__name__}.")
        flops = counter(state.batch)
        return None if flops is None else float(flops)

    def _peak(self, state: State) -> Optional[float]:
        """The device's peak FLOP/s: ``peak_flops``, else the table's (looked up once)."""
        if self.peak_flops is not None:
            return self.peak_flops
        if not self._peak_resolved:
            self._peak_resolved = True
            self._device_peak = device_peak_flops(state.device, state.precision)
            if self._device_peak is None and state.device.type == "cuda":
                import torch

                log.warning(
                    "SpeedMonitor: no peak FLOP/s for %r at precision %s in "
                    "cadence.utils.flops.PEAK_FLOPS, so MFU is not logged; pass "
                    "speed_monitor: {peak_flops: <FLOP/s of one device>}.",
                    torch.cuda.get_device_name(state.device), state.precision)
        return self._device_peak

    # -- events ---------------------------------------------------------------------------
    def fit_start(self, state: State, logger: Any) -> None:
        del state, logger
        self._start_fit_clock()

    def batch_start(self, state: State, logger: Any) -> None:
        del state, logger
        if self._fit_started_at is None:  # FIT_START was not fired (a hand-driven loop)
            self._start_fit_clock()

    def batch_end(self, state: State, logger: Any) -> None:
        now = time.perf_counter()
        if self._fit_started_at is None:
            self._start_fit_clock()
            self._fit_started_at = now
        batch_flops = self._batch_flops(state)
        if batch_flops is not None:
            self._flops_so_far += batch_flops
        timestamp = state.timestamp
        train_seconds = self._train_seconds(now)
        self._history.append(_Point(train_seconds, int(timestamp.batch), int(timestamp.sample),
                                    int(timestamp.token), self._flops_so_far))
        metrics: dict[str, float] = {}
        first, last = self._history[0], self._history[-1]
        elapsed = last.train_seconds - first.train_seconds
        if len(self._history) > 1 and elapsed > 0:
            world_size = get_world_size()
            batches_per_sec = (last.batch - first.batch) / elapsed
            samples_per_sec = (last.sample - first.sample) / elapsed
            metrics["throughput/batches_per_sec"] = batches_per_sec
            metrics["throughput/samples_per_sec"] = samples_per_sec
            metrics["throughput/device/batches_per_sec"] = batches_per_sec / world_size
            metrics["throughput/device/samples_per_sec"] = samples_per_sec / world_size
            if last.token > 0:
                tokens_per_sec = (last.token - first.token) / elapsed
                metrics["throughput/tokens_per_sec"] = tokens_per_sec
                metrics["throughput/device/tokens_per_sec"] = tokens_per_sec / world_size
            if batch_flops is not None:
                device_flops_per_sec = (last.flops - first.flops) / elapsed
                metrics["throughput/flops_per_sec"] = device_flops_per_sec * world_size
                metrics["throughput/device/flops_per_sec"] = device_flops_per_sec
                peak = self._peak(state)
                if peak is not None:
                    metrics["throughput/device/mfu"] = device_flops_per_sec / peak
        eval_seconds = self._eval_seconds
        metrics["time/train"] = train_seconds / self._divider
        metrics["time/val"] = eval_seconds / self._divider
        metrics["time/total"] = (train_seconds + eval_seconds) / self._divider
        logger.log_metrics(metrics)

    def fit_end(self, state: State, logger: Any) -> None:
        del state, logger
        now = time.perf_counter()
        self._train_offset = self._train_seconds(now)
        self._fit_started_at = None  # the window stays readable (history_*) until the next fit

    # -- checkpointing --------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The training and eval seconds so far, so a resumed run's wall clock continues."""
        return {"train_seconds": self._train_seconds(time.perf_counter()),
                "eval_seconds": self._eval_seconds}

    def load_state_dict(self, state: dict[str, Union[float, int]]) -> None:
        """Continue the wall clock from a checkpoint (call before ``FIT_START``)."""
        self._train_offset = float(state.get("train_seconds", 0.0))
        self._eval_seconds = float(state.get("eval_seconds", 0.0))
        self._eval_seconds_at_fit_start = self._eval_seconds
        if self._fit_started_at is not None:  # loaded mid-fit: restart the clock from now
            self._fit_started_at = time.perf_counter()
