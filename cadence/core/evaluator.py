"""An :class:`Evaluator`: a named eval dataloader and the metrics computed on it.

Source: MosaicML Composer's ``Evaluator`` (``composer/core/evaluator.py``), same arguments;
``dataloader`` becomes a :class:`~cadence.core.data_spec.DataSpec` as in Composer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from cadence.core.data_spec import DataSpec, ensure_data_spec

__all__ = ["Evaluator", "ensure_evaluator", "filter_metrics"]


@dataclass
class Evaluator:
    """A named eval dataloader and the metrics computed on it.

    Args:
        label: the name used in metric keys (``metrics/<label>/<MetricName>``); default ``eval``.
        dataloader: yields eval batches: a dataloader, a
            :class:`~cadence.core.data_spec.DataSpec` or a dict of DataSpec arguments; stored
            as a DataSpec (``evaluator.dataloader.dataloader`` is the dataloader), whose
            ``device_transforms`` and sample/token counters the Trainer uses.
        metric_names: which of the model's ``get_metrics(is_train=False)`` to compute: a list
            of regular expressions, each searched case-insensitively in the metric names
            (``"accuracy"`` selects ``MulticlassAccuracy``, ``"Top-."`` both ``Top-1`` and
            ``Top-5``); ``None`` means all of them (Composer's). An entry that selects no
            metric is refused when the Trainer builds the metrics (a typo would silently
            evaluate nothing).
        subset_num_batches: evaluate on at most this many batches (``-1``: all); ``None``:
            the Trainer's ``eval_subset_num_batches``. (Composer's argument.)
        eval_interval: when this evaluator runs during ``fit``: a Time (``"1ep"``,
            ``"500ba"``, ``"0.25dur"``; an int means epochs; ``0``: never) or a callable
            ``(state, event) -> bool`` called on ``BATCH_END`` and ``EPOCH_END``; ``None``: the
            Trainer's ``eval_interval``. (Composer's argument.)
        device_eval_microbatch_size: forward each eval batch in microbatches of this many
            samples (less activation memory; the metrics are the same); ``None``: the whole
            batch at once. (Composer's argument; its ``"auto"`` is refused: cadence retries
            out-of-memory microbatches in training only.)

    Raises:
        ValueError: ``metric_names`` is not a list (or tuple) of strings;
            ``device_eval_microbatch_size`` is not a positive int or ``None``.
    """

    label: str
    dataloader: Union[DataSpec, Iterable[Any], dict[str, Any]]
    metric_names: Optional[Sequence[str]] = None
    subset_num_batches: Optional[int] = None
    eval_interval: Any = None
    device_eval_microbatch_size: Optional[int] = None

    def __post_init__(self) -> None:
        self.dataloader = ensure_data_spec(self.dataloader)
        size = self.device_eval_microbatch_size
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ValueError(f"Evaluator {self.label!r}: device_eval_microbatch_size must be a "
                             f"positive int (samples per forward) or None (the whole batch), "
                             f"got {size!r}.")
        names = self.metric_names
        if names is not None and (not isinstance(names, (list, tuple))
                                  or not all(isinstance(n, str) for n in names)):
            raise ValueError(f"Evaluator {self.label!r}: metric_names must be a list of metric "
                             f"names (regular expressions), got {names!r}.")


def filter_metrics(metrics: Mapping[str, Any], metric_names: Optional[Sequence[str]],
                   label: str = "eval") -> dict[str, Any]:
    """The entries of ``metrics`` whose name matches one of ``metric_names`` (each a regular
    expression searched case-insensitively, Composer's rule); all of them for ``None``.

    Raises:
        ValueError: an entry of ``metric_names`` matches none of the metrics (naming it, the
            evaluator ``label`` and the metrics there are).
    """
    if metric_names is None:
        return dict(metrics)
    unmatched = [p for p in metric_names
                 if not any(re.search(p, name, re.IGNORECASE) for name in metrics)]
    if unmatched:
        raise ValueError(f"Evaluator {label!r} asks for metrics {unmatched}, which match none of "
                         f"the model's metrics {sorted(metrics)}.")
    return {name: metric for name, metric in metrics.items()
            if any(re.search(p, name, re.IGNORECASE) for p in metric_names)}


def ensure_evaluator(evaluator: Union[Evaluator, DataSpec, Iterable[Any], dict[str, Any]],
                     default_metric_names: Sequence[str]) -> Evaluator:
    """``evaluator`` as an :class:`Evaluator` (Composer's): an Evaluator is returned as it
    is; a dict holds Evaluator arguments (``label`` defaults to ``"eval"``); anything else
    is a dataloader or DataSpec, labelled ``"eval"``. Evaluators made here compute
    ``default_metric_names``."""
    if isinstance(evaluator, Evaluator):
        return evaluator
    if isinstance(evaluator, dict) and "dataloader" in evaluator:
        return Evaluator(**{"label": "eval", "metric_names": list(default_metric_names),
                            **evaluator})
    return Evaluator(label="eval", dataloader=evaluator, metric_names=list(default_metric_names))
