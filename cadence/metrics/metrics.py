"""General metrics that Composer users compose: :class:`CrossEntropy` and :class:`LossMetric`.

Source: MosaicML Composer's ``composer/metrics/metrics.py`` (same names and arguments).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torchmetrics import Metric

__all__ = ["CrossEntropy", "LossMetric"]


class CrossEntropy(Metric):
    """The mean over batches of :func:`~cadence.loss.soft_cross_entropy` (class indices or
    probabilities), for classifiers.

    States (summed across ranks): ``sum_loss`` (float32) and ``total_batches`` (int64).
    As in Composer, each batch counts once whatever its size (the mean of batch means).

    Args:
        ignore_index: target index left out; default ``-100``.
        dist_sync_on_step: torchmetrics option; default ``False``.

    Source: Composer ``composer/metrics/metrics.py`` (``CrossEntropy``).
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = False

    sum_loss: torch.Tensor
    total_batches: torch.Tensor

    def __init__(self, ignore_index: int = -100, dist_sync_on_step: bool = False) -> None:
        super().__init__(dist_sync_on_step=dist_sync_on_step)
        self.ignore_index = ignore_index
        self.add_state("sum_loss", default=torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("total_batches", default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, preds: torch.Tensor, targets: torch.Tensor) -> None:  # type: ignore[override]
        """Add one batch: logits ``[N, C, ...]`` and class ids ``[N, ...]`` or
        probabilities ``[N, C, ...]``."""
        from cadence.loss import soft_cross_entropy

        self.sum_loss += soft_cross_entropy(preds, targets, ignore_index=self.ignore_index)
        self.total_batches += 1

    def compute(self) -> torch.Tensor:
        """The mean batch loss in nats."""
        return self.sum_loss / self.total_batches


class LossMetric(Metric):
    """Turns a loss function ``loss_function(preds, targets) -> scalar`` into a metric: the
    mean of its value over batches (each batch counts once).

    Args:
        loss_function: e.g. ``torch.nn.MSELoss()`` or ``soft_cross_entropy``.
        dist_sync_on_step: torchmetrics option; default ``False``.

    Source: Composer ``composer/metrics/metrics.py`` (``LossMetric``).
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = False

    sum_loss: torch.Tensor
    total_batches: torch.Tensor

    def __init__(self, loss_function: Callable[..., torch.Tensor],
                 dist_sync_on_step: bool = False) -> None:
        super().__init__(dist_sync_on_step=dist_sync_on_step)
        if not callable(loss_function):
            raise TypeError(f"LossMetric needs a callable loss_function, got "
                            f"{type(loss_function).__name__}.")
        self.loss_function = loss_function
        self.add_state("sum_loss", default=torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("total_batches", default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, preds: Any, targets: Any) -> None:  # type: ignore[override]
        """Add ``loss_function(preds, targets)`` for one batch."""
        self.sum_loss += self.loss_function(preds, targets).detach().float()
        self.total_batches += 1

    def compute(self) -> torch.Tensor:
        """The mean batch loss."""
        return self.sum_loss / self.total_batches
