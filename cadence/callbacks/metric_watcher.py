"""What the metric stoppers share: the watched metric, where it is read, and how values
compare (:class:`MetricWatcher`, :func:`lower_is_better`, :func:`parse_comparison`)."""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

import torch

from cadence.core.callback import Callback

if TYPE_CHECKING:
    from cadence.core.state import State

__all__ = ["Comparison", "MetricWatcher", "lower_is_better", "parse_comparison"]

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


def parse_comparison(comp: Union[str, Comparison, None], default: str,
                     who: str) -> tuple[Comparison, str]:
    """``(function, name)`` for a stopper's ``comp``: ``"<"``, ``"<="``, ``">"``, ``">="``, a
    callable ``(value, reference) -> bool``, or None for ``default``.

    Raises:
        ValueError: another string (the message names ``who`` and the allowed values).
    """
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


class MetricWatcher(Callback):
    """What both stoppers (:class:`~cadence.callbacks.early_stopper.EarlyStopper`,
    :class:`~cadence.callbacks.threshold_stopper.ThresholdStopper`) share: which metric, where
    to read it, and when. Subclasses implement ``_check(state)``."""

    def __init__(self, monitor: str, dataloader_label: str) -> None:
        # Not checked here: Composer builds with any name (llm-foundry builds one with
        # monitor=''); fit_start refuses a metric the run does not compute, naming those it does.
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
