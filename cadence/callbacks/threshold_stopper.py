"""Stop training once a metric reaches a threshold: :class:`ThresholdStopper`.

Source: MosaicML Composer's ``ThresholdStopper`` (``composer/callbacks/threshold_stopper.py``).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any, Optional, Union

import torch

from cadence.callbacks.metric_watcher import (
    Comparison, MetricWatcher, lower_is_better, parse_comparison,
)
from cadence.registry import callbacks

if TYPE_CHECKING:
    from cadence.core.state import State

__all__ = ["ThresholdStopper"]

log = logging.getLogger(__name__)


@callbacks.register("threshold_stopper")
class ThresholdStopper(MetricWatcher):
    """Stops training once a metric reaches a threshold (sets ``state.stop_training``; the
    run ends after the current batch, and its eval and checkpoint events).

    When it checks: for an evaluator's metric, after each evaluation (``EVAL_AFTER_ALL``);
    for a training metric (``dataloader_label="train"``, the trainer's per-batch
    ``state.train_metrics``), at every ``EPOCH_END``, or at every ``BATCH_END`` with
    ``stop_on_batch``.

    Args:
        monitor: the metric's name, as the model's ``get_metrics`` names it.
        dataloader_label: the evaluator's label, or ``train``.
        threshold: the value to reach (in the metric's units), compared at the metric's
            precision (a float32 metric is compared with ``threshold`` rounded to float32).
        comp: stop when ``comp(value, threshold)`` holds: ``"<="``, ``"<"``, ``">="``, ``">"``
            or a callable. Default: ``"<="`` for names containing loss, error, perplexity or
            entropy (see :func:`lower_is_better`), else ``">="``.
        stop_on_batch: for a training metric, check after every batch, not every epoch.

    Raises:
        ValueError: a bad ``comp`` or a non-finite ``threshold``; at ``FIT_START``, a label
            or metric the run does not have.

    Example::

        ThresholdStopper("MulticlassAccuracy", "eval", threshold=0.95)
    """

    def __init__(
        self,
        monitor: str,
        dataloader_label: str,
        threshold: float,
        comp: Union[str, Comparison, None] = None,
        stop_on_batch: bool = False,
    ) -> None:
        super().__init__(monitor, dataloader_label)
        if not math.isfinite(float(threshold)):
            raise ValueError(f"ThresholdStopper threshold must be finite, got {threshold!r}.")
        self.threshold = float(threshold)
        default = "<=" if lower_is_better(monitor) else ">="
        self.comp, self.comp_name = parse_comparison(comp, default, "ThresholdStopper")
        self.stop_on_batch = bool(stop_on_batch)
        self.last_value: Optional[float] = None

    def _check(self, state: State) -> None:
        read = self._read_with_dtype(state)
        if read is None:
            return
        value, dtype = read
        self.last_value = value
        # Compare at the metric's precision: a float32 accuracy of 0.9 is 0.89999998, which
        # must still reach threshold=0.9.
        threshold = self.threshold
        if dtype is not None and dtype.is_floating_point:
            threshold = float(torch.tensor(threshold, dtype=dtype))
        if self.comp(value, threshold):
            state.stop_training = True
            log.info("ThresholdStopper: %s = %s reached %s %s at batch %d; stopping.",
                     self.key, value, self.comp_name, self.threshold, int(state.timestamp.batch))

    def batch_end(self, state: State, logger: Any) -> None:
        del logger
        if self.watches_train and self.stop_on_batch:
            self._check(state)

    def epoch_end(self, state: State, logger: Any) -> None:
        del logger
        if self.watches_train and not self.stop_on_batch:
            self._check(state)

    def state_dict(self) -> dict[str, Any]:
        """The last value checked (for the record; the decision needs no history)."""
        return {"last_value": self.last_value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        last = state.get("last_value")
        self.last_value = None if last is None else float(last)
