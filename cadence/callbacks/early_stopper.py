"""Stop training on a metric: :class:`EarlyStopper` (no improvement for a while) and
:class:`ThresholdStopper` (a target reached).

Source: MosaicML Composer's ``EarlyStopper`` and ``ThresholdStopper``
(``composer/callbacks/early_stopper.py``, ``threshold_stopper.py``).
"""

from __future__ import annotations

import logging
import math
import operator
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

import torch

from cadence.trainer.core import Callback, Time, Timestamp, TimeUnit
from cadence.trainer.registry import callbacks

if TYPE_CHECKING:
    from cadence.trainer.core import State

__all__ = ["EarlyStopper", "ThresholdStopper", "lower_is_better"]

log = logging.getLogger(__name__)

Comparison = Callable[[float, float], bool]

_COMPARISONS: dict[str, Comparison] = {
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
}
# A metric whose name holds one of these (case-insensitive) is better when lower.
_LOWER_IS_BETTER = ("loss", "error", "perplexity", "entropy")


def lower_is_better(monitor: str) -> bool:
    """Whether a metric named ``monitor`` is better when lower: names containing ``loss``,
    ``error``, ``perplexity`` or ``entropy`` (case-insensitive, e.g. ``LanguagePerplexity``,
    ``LanguageCrossEntropy``, ``MeanSquaredError``); anything else (accuracy, F1, ...) is
    better when higher. Composer's rule, with ``entropy`` added."""
    name = monitor.lower()
    return any(part in name for part in _LOWER_IS_BETTER)


def _parse_comp(comp: Union[str, Comparison, None], default: str,
                who: str) -> tuple[Comparison, str]:
    if comp is None:
        comp = default
    if callable(comp):
        return comp, getattr(comp, "__name__", repr(comp))
    if comp not in _COMPARISONS:
        raise ValueError(
            f"{who} comp {comp!r} is not one of {', '.join(repr(c) for c in _COMPARISONS)} (or a "
            f"callable (value, reference) -> bool); leave it None to choose by the metric's name."
        )
    return _COMPARISONS[comp], comp


class _MetricWatcher(Callback):
    """What both stoppers share: which metric, where to read it, and when."""

    def __init__(self, monitor: str, dataloader_label: str) -> None:
        if not monitor or not dataloader_label:
            raise ValueError(
                f"{type(self).__name__} needs a metric name and a dataloader label, e.g. "
                f"monitor='LanguagePerplexity', dataloader_label='eval'; got monitor="
                f"{monitor!r}, dataloader_label={dataloader_label!r}."
            )
        self.monitor = monitor
        self.dataloader_label = dataloader_label

    @property
    def key(self) -> str:
        """The watched metric's logged name, ``metrics/<label>/<monitor>``."""
        return f"metrics/{self.dataloader_label}/{self.monitor}"

    @property
    def watches_train(self) -> bool:
        return self.dataloader_label == "train"

    def _metrics(self, state: State) -> Optional[dict[str, Any]]:
        if self.watches_train:
            return state.train_metrics
        return state.eval_metrics.get(self.dataloader_label)

    def fit_start(self, state: State, logger: Any) -> None:
        """Check the watched metric exists, so a typo fails now, not silently never stops.

        Raises:
            ValueError: naming the labels and metric names the run has.
        """
        del logger
        metrics = self._metrics(state)
        if metrics is None:
            labels = ["train", *state.eval_metrics]
            raise ValueError(
                f"{type(self).__name__}: no metrics labelled {self.dataloader_label!r}; this run "
                f"has {labels}. Use dataloader_label='train' for a training metric or the "
                f"label of one of the Trainer's evaluators."
            )
        if self.monitor not in metrics:
            raise ValueError(
                f"{type(self).__name__}: metric {self.monitor!r} is not computed for "
                f"{self.dataloader_label!r}; the metrics there are {sorted(metrics)}."
            )

    def _read(self, state: State) -> Optional[float]:
        """The watched metric's current value (``compute()``: a host sync), or None when it
        is not there (e.g. ``Trainer.eval`` on other evaluators)."""
        read = self._read_with_dtype(state)
        return None if read is None else read[0]

    def _read_with_dtype(self, state: State) -> Optional[tuple[float, Optional[torch.dtype]]]:
        metrics = self._metrics(state)
        if metrics is None or self.monitor not in metrics:
            return None
        value = metrics[self.monitor].compute()
        dtype = value.dtype if isinstance(value, torch.Tensor) else None
        try:
            return float(value), dtype
        except (TypeError, ValueError, RuntimeError):
            raise ValueError(
                f"{type(self).__name__}: {self.key} computes {type(value).__name__}, not a single "
                f"number; monitor a scalar metric."
            ) from None

    def _check(self, state: State) -> None:
        raise NotImplementedError

    def eval_after_all(self, state: State, logger: Any) -> None:
        # After every evaluator has run, so each label's metrics are this evaluation's.
        del logger
        if not self.watches_train:
            self._check(state)


@callbacks.register("early_stopper")
class EarlyStopper(_MetricWatcher):
    """Stops training when a metric has stopped improving (sets ``state.stop_training``;
    the run ends after the current batch, and its eval and checkpoint events).

    When it checks: for an evaluator's metric, after each evaluation (``EVAL_AFTER_ALL``);
    for a training metric (``dataloader_label="train"``, the trainer's per-batch
    ``state.train_metrics``), at every ``BATCH_END`` when ``patience`` is in batches, else at
    every ``EPOCH_END``.

    A value improves on the best so far when ``comp(value, best)`` holds and it differs from
    the best by more than ``min_delta``; the first value checked is the first best.

    Args:
        monitor: the metric's name, as the model's ``get_metrics`` names it (e.g.
            ``LanguagePerplexity``; logged as ``metrics/<label>/<monitor>``).
        dataloader_label: the evaluator's label (default ``eval``), or ``train``.
        comp: ``"<"`` (lower is better) or ``">"`` (higher is better) (``"<="``, ``">="``
            and a callable ``(value, best) -> bool`` are accepted too). Default: ``"<"`` for
            names containing loss, error, perplexity or entropy (see :func:`lower_is_better`),
            else ``">"``.
        min_delta: the smallest change that counts as an improvement (in the metric's units).
        patience: how long the metric may go without improving. An ``int`` ``n``: stop at the
            ``n``-th check in a row without improvement (``1``: the first one). A time
            (``"1ep"``, ``"500ba"``, ``"0.1dur"``, any unit): stop at the first check made
            *more* than that long after the best value (Composer's rule; so with an evaluation
            each epoch, ``"1ep"`` stops at the second evaluation without improvement).
            Default ``"1ep"``.

    Raises:
        ValueError: a bad ``comp``, a negative ``min_delta``, a non-positive ``patience``;
            at ``FIT_START``, a label or metric the run does not have.

    Example::

        EarlyStopper("LanguagePerplexity", "eval", patience=3)  # 3 evals without improvement
    """

    def __init__(
        self,
        monitor: str,
        dataloader_label: str = "eval",
        comp: Union[str, Comparison, None] = None,
        min_delta: float = 0.0,
        patience: Union[int, str, Time] = "1ep",
    ) -> None:
        super().__init__(monitor, dataloader_label)
        default = "<" if lower_is_better(monitor) else ">"
        self.comp, self.comp_name = _parse_comp(comp, default, "EarlyStopper")
        if min_delta < 0:
            raise ValueError(f"EarlyStopper min_delta must be >= 0, got {min_delta!r}.")
        self.min_delta = float(min_delta)
        if isinstance(patience, int) and not isinstance(patience, bool):
            if patience < 1:
                raise ValueError(f"EarlyStopper patience must be >= 1 check, got {patience!r}.")
            self.patience: Union[int, Time] = patience
        else:
            patience_time = Time.from_input(patience)
            if patience_time.value <= 0:
                raise ValueError(f"EarlyStopper patience must be > 0, got {patience!r}.")
            self.patience = patience_time
        self.best: Optional[float] = None
        self.best_timestamp: Optional[Timestamp] = None
        self.checks_since_best = 0

    def _improves(self, value: float) -> bool:
        if self.best is None:
            return not math.isnan(value)
        return bool(self.comp(value, self.best)) and abs(value - self.best) > self.min_delta

    def _out_of_patience(self, state: State) -> bool:
        if isinstance(self.patience, int):
            return self.checks_since_best >= self.patience
        # With no best yet (only NaNs so far), count from the start of training.
        since = self.best_timestamp if self.best_timestamp is not None else Timestamp()
        patience = state.to_time(self.patience)
        waited = state.timestamp.get(patience.unit).value - since.get(patience.unit).value
        return waited > patience.value

    def _check(self, state: State) -> None:
        value = self._read(state)
        if value is None:
            return
        if self._improves(value):
            self.best, self.best_timestamp, self.checks_since_best = value, state.timestamp, 0
            return
        self.checks_since_best += 1
        if self._out_of_patience(state):
            state.stop_training = True
            since = int(self.best_timestamp.batch) if self.best_timestamp is not None else 0
            log.info(
                "EarlyStopper: %s = %s has not improved on %s (comp %s, min_delta %s) since batch "
                "%d; stopping at batch %d (patience %s).",
                self.key, value, self.best, self.comp_name, self.min_delta, since,
                int(state.timestamp.batch), self.patience,
            )

    def batch_end(self, state: State, logger: Any) -> None:
        del logger
        if self.watches_train and isinstance(self.patience, Time) \
                and self.patience.unit == TimeUnit.BATCH:
            self._check(state)

    def epoch_end(self, state: State, logger: Any) -> None:
        del logger
        if self.watches_train and not (isinstance(self.patience, Time)
                                       and self.patience.unit == TimeUnit.BATCH):
            self._check(state)

    def state_dict(self) -> dict[str, Any]:
        """The best value, when it was seen, and the checks since."""
        stamp = self.best_timestamp
        return {"best": self.best, "best_timestamp": None if stamp is None else stamp.state_dict(),
                "checks_since_best": self.checks_since_best}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        best = state.get("best")
        self.best = None if best is None else float(best)
        stamp = state.get("best_timestamp")
        self.best_timestamp = None if stamp is None else Timestamp.from_state_dict(stamp)
        self.checks_since_best = int(state.get("checks_since_best", 0))


@callbacks.register("threshold_stopper")
class ThresholdStopper(_MetricWatcher):
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
        self.comp, self.comp_name = _parse_comp(comp, default, "ThresholdStopper")
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
