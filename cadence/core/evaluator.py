"""An :class:`Evaluator`: a named eval dataloader and the metrics computed on it.

Source: MosaicML Composer's ``Evaluator`` (``composer/core/evaluator.py``), same arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence

__all__ = ["Evaluator"]


@dataclass
class Evaluator:
    """A named eval dataloader and the metrics computed on it.

    Args:
        label: the name used in metric keys (``metrics/<label>/<MetricName>``); default ``eval``.
        dataloader: yields eval batches.
        metric_names: which of the model's ``get_metrics(is_train=False)`` to compute;
            ``None`` means all of them.
        subset_num_batches: evaluate on at most this many batches (``-1``: all); ``None``:
            the Trainer's ``eval_subset_num_batches``. (Composer's argument.)
        eval_interval: when this evaluator runs during ``fit``: a Time (``"1ep"``,
            ``"500ba"``, ``"0.25dur"``; an int means epochs) or a callable
            ``(state, event) -> bool`` called on ``BATCH_END`` and ``EPOCH_END``; ``None``: the
            Trainer's ``eval_interval``. (Composer's argument.)
    """

    label: str
    dataloader: Iterable[Any]
    metric_names: Optional[Sequence[str]] = None
    subset_num_batches: Optional[int] = None
    eval_interval: Any = None
