"""The :class:`ComposerClassifier`: a plain ``nn.Module`` classifier as a ComposerModel.

Source: MosaicML Composer's ``ComposerClassifier`` (``composer/models/tasks/classification.py``):
same arguments, defaults, metric names and batch format.

No ``from __future__ import annotations``: TorchScript reads class-level annotations
(``num_classes: Optional[int]``) as types and cannot resolve them as strings, and
``torch.jit.script(classifier)`` must work (:func:`cadence.utils.export_for_inference`).
"""

import warnings
from typing import Any, Callable, Optional, Tuple

import torch
from torch import nn

from cadence.loss import soft_cross_entropy
from cadence.models.base import ComposerModel

__all__ = ["ComposerClassifier"]


class ComposerClassifier(ComposerModel):
    """Wraps ``module`` (inputs -> logits ``[N, num_classes]``) for batches ``(inputs, targets)``.

    Args:
        module: the network; ``forward(batch)`` returns ``module(batch[0])``.
        num_classes: the number of classes; needed unless ``module`` has a ``num_classes``
            attribute (which wins, with a warning if they differ) or both metric arguments
            are given.
        train_metrics: a torchmetrics ``Metric`` or ``MetricCollection`` for training; default
            ``MulticlassAccuracy(num_classes, average='micro')``.
        val_metrics: the same for evaluation; default ``CrossEntropy`` and
            ``MulticlassAccuracy(num_classes, average='micro')``.
        loss_fn: ``loss_fn(outputs, targets)``; default
            :func:`~cadence.loss.soft_cross_entropy` (class indices or probabilities).

    Metric names are the metric's class name (``MulticlassAccuracy``, ``CrossEntropy``), or
    the collection's keys, so they are logged as ``metrics/eval/MulticlassAccuracy``.

    Raises:
        ValueError: no ``num_classes`` from either source and a metric argument missing.

    Example::

        model = ComposerClassifier(torchvision.models.resnet18(), num_classes=1000)
    """

    num_classes: Optional[int] = None
    #: not part of inference: ``torch.jit.script`` leaves the metrics out
    __jit_ignored_attributes__ = ["train_metrics", "val_metrics"]

    def __init__(
        self,
        module: nn.Module,
        num_classes: Optional[int] = None,
        train_metrics: Any = None,
        val_metrics: Any = None,
        loss_fn: Callable[..., torch.Tensor] = soft_cross_entropy,
    ) -> None:
        super().__init__()
        self.module = module
        self._loss_fn = loss_fn
        self.num_classes = num_classes
        module_classes = getattr(module, "num_classes", None)
        if module_classes is not None:
            if num_classes is not None and num_classes != module_classes:
                warnings.warn(f"ComposerClassifier: num_classes={num_classes} does not match the "
                              f"module's num_classes={module_classes}; using the module's.",
                              stacklevel=2)
            self.num_classes = int(module_classes)
        if self.num_classes is None and (train_metrics is None or val_metrics is None):
            raise ValueError(
                "ComposerClassifier needs the number of classes: pass num_classes=, give the "
                "module a num_classes attribute, or pass both train_metrics and val_metrics."
            )
        if train_metrics is None or val_metrics is None:
            from torchmetrics import MetricCollection
            from torchmetrics.classification import MulticlassAccuracy

            from cadence.metrics.metrics import CrossEntropy

            assert self.num_classes is not None
            if train_metrics is None:
                train_metrics = MulticlassAccuracy(num_classes=self.num_classes, average="micro")
            if val_metrics is None:
                val_metrics = MetricCollection([
                    CrossEntropy(),
                    MulticlassAccuracy(num_classes=self.num_classes, average="micro"),
                ])
        self.train_metrics = train_metrics
        self.val_metrics = val_metrics

    def forward(self, batch: Tuple[torch.Tensor, Any]) -> torch.Tensor:
        """Logits ``[N, num_classes]`` for ``batch = (inputs, targets)`` (a list works too;
        a scripted classifier takes a tuple; the targets are not read)."""
        inputs = batch[0]
        return self.module(inputs)

    def loss(self, outputs: torch.Tensor, batch: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        """``loss_fn(outputs, targets, *args, **kwargs)``."""
        _, targets = batch
        return self._loss_fn(outputs, targets, *args, **kwargs)

    def get_metrics(self, is_train: bool = False) -> dict[str, Any]:
        """``{name: metric}``: a single metric under its class name, a collection by its keys."""
        from torchmetrics import Metric

        metrics = self.train_metrics if is_train else self.val_metrics
        if isinstance(metrics, Metric):
            return {type(metrics).__name__: metrics}
        return dict(metrics.items())

    def update_metric(self, batch: Any, outputs: Any, metric: Any) -> None:
        """``metric.update(outputs, targets)``."""
        _, targets = batch
        metric.update(outputs, targets)


