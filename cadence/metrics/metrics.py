"""General metrics that Composer users compose: :class:`CrossEntropy`, :class:`LossMetric`,
and the segmentation metrics :class:`MIoU` and :class:`Dice`.

Source: MosaicML Composer's ``composer/metrics/metrics.py`` (same names and arguments).

No ``from __future__ import annotations`` here: TorchScript reads a module's class-level
annotations (the metric states ``sum_loss: torch.Tensor``) as types, and cannot resolve
them as strings, so scripting a model that holds these metrics (``torch.jit.script`` of a
:class:`~cadence.models.tasks.classification.ComposerClassifier`) would fail.
"""

import functools
from typing import Any, Callable

import torch
from torchmetrics import Metric

from cadence.loss import soft_cross_entropy

__all__ = ["CrossEntropy", "Dice", "LossMetric", "MIoU"]


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


class MIoU(Metric):
    """Mean intersection over union for semantic segmentation, in percent.

    Per class, pixels where prediction and target agree (the intersection) and pixels where
    either names the class (the union) are counted over every update; :meth:`compute` is
    ``100 * mean_c(intersection_c / union_c)`` over the classes with a nonzero union.
    ``update(logits, targets)``: logits ``[N, C, H, W]`` (argmax over ``C``), targets
    ``[N, H, W]`` class indices; pixels equal to ``ignore_index`` are skipped.

    Args:
        num_classes: ``C``.
        ignore_index: target value skipped; default ``-1``.

    States (summed across ranks, float64): ``total_intersect``, ``total_union`` ``[C]``.

    Source: Composer's ``MIoU`` (``composer/metrics/metrics.py``); the mmsegmentation
    definition.
    """

    full_state_update = False

    def __init__(self, num_classes: int, ignore_index: int = -1) -> None:
        super().__init__(dist_sync_on_step=True)
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"MIoU num_classes must be an int >= 1, got {num_classes!r}.")
        self.num_classes, self.ignore_index = num_classes, ignore_index
        zeros = torch.zeros(num_classes, dtype=torch.float64)
        self.add_state("total_intersect", default=zeros.clone(), dist_reduce_fx="sum")
        self.add_state("total_union", default=zeros.clone(), dist_reduce_fx="sum")

    def update(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        predictions = logits.argmax(dim=1)
        keep = targets != self.ignore_index
        predictions, targets = predictions[keep], targets[keep].long()
        count = functools.partial(torch.bincount, minlength=self.num_classes)
        intersect = count(targets[predictions == targets])[: self.num_classes]
        predicted = count(predictions)[: self.num_classes]
        actual = count(targets)[: self.num_classes]
        self.total_intersect += intersect.double()
        self.total_union += (predicted + actual - intersect).double()

    def compute(self) -> torch.Tensor:
        present = self.total_union != 0
        return 100 * (self.total_intersect[present] / self.total_union[present]).mean()


class Dice(Metric):
    """The Dice coefficient for segmentation, in percent, averaged over the foreground classes
    and over updates (each update counts once, whatever its size).

    ``update(preds, targets)``: ``preds`` ``[N, num_classes + 1, ...]`` scores whose channel 0
    is the background (argmax over channels), ``targets`` ``[N, ...]`` indices. Per
    foreground class ``c``: ``2 TP / (2 TP + FP + FN)``; a class absent from the targets
    scores 1 when it is also never predicted, else 0. :meth:`compute` is
    ``round(100 * mean_c(sum of scores / updates), 2)`` (a Python float, as Composer).

    Args:
        num_classes: the number of foreground classes (the score channels less one).

    Source: Composer's ``Dice`` (``composer/metrics/metrics.py``), with the same counting.
    """

    full_state_update = False

    def __init__(self, num_classes: int) -> None:
        super().__init__(dist_sync_on_step=True)
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"Dice num_classes must be an int >= 1 (foreground classes), "
                             f"got {num_classes!r}.")
        self.num_classes = num_classes
        self.add_state("n_updates", default=torch.zeros(1), dist_reduce_fx="sum")
        self.add_state("dice", default=torch.zeros(num_classes), dist_reduce_fx="sum")

    def update(self, preds: torch.Tensor, targets: torch.Tensor) -> None:
        if preds.shape[1] != self.num_classes + 1:
            raise ValueError(f"Dice(num_classes={self.num_classes}) expects "
                             f"{self.num_classes + 1} score channels (background first), got "
                             f"preds of shape {tuple(preds.shape)}.")
        predicted = preds.argmax(dim=1) if preds.ndim == targets.ndim + 1 else preds
        scores = torch.zeros(self.num_classes, device=preds.device)
        for index in range(1, self.num_classes + 1):
            is_pred, is_target = predicted == index, targets == index
            if not is_target.any():
                scores[index - 1] = float(not is_pred.any())
                continue
            hits = (is_pred & is_target).sum()
            misses = (is_pred ^ is_target).sum()  # false positives plus false negatives
            scores[index - 1] = 2 * hits / (2 * hits + misses)
        self.n_updates += 1
        self.dice += scores

    def compute(self) -> float:
        return round(float((100 * self.dice / self.n_updates).mean()), 2)
