"""Composer's losses: cross entropy that takes class indices or class probabilities (one-hot,
smoothed, mixed), binary cross entropy for multi-label targets, and the soft Dice loss.

Shapes: ``N`` = samples, ``C`` = classes, ``d_1 ... d_K`` = optional extra dimensions
(pixels, positions).

Source: the API of MosaicML Composer's ``composer/loss/loss.py`` (same names, arguments,
defaults and maths); implemented anew.
"""

from __future__ import annotations

import warnings
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch.nn.modules.loss import _Loss

from cadence.loss.utils import ensure_targets_one_hot, infer_target_type

__all__ = ["DiceLoss", "binary_cross_entropy_with_logits", "infer_target_type", "loss_registry",
           "soft_cross_entropy"]

_REDUCTIONS = ("mean", "sum", "none")


def soft_cross_entropy(
    input: torch.Tensor,
    target: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    size_average: Optional[bool] = None,
    ignore_index: int = -100,
    reduce: Optional[bool] = None,
    reduction: str = "mean",
) -> torch.Tensor:
    r"""Drop-in :func:`torch.nn.functional.cross_entropy` that also takes dense targets.

    With class indices this *is* ``F.cross_entropy``. With class probabilities ``p`` (the
    input's shape) each sample's loss is :math:`-\sum_c w_c\, p_c \log \mathrm{softmax}(x)_c`,
    and ``reduction='mean'`` divides the summed loss by the total target probability (the
    number of samples when every row sums to 1), so rows of zeros count as ignored samples.

    Args:
        input: logits, ``[N, C]`` or ``[N, C, d_1, ..., d_K]``.
        target: class indices ``[N]`` / ``[N, d_1, ..., d_K]``, or probabilities of
            ``input``'s shape.
        weight: per-class rescaling ``[C]``; default none.
        size_average: deprecated torch argument, passed through for indices; must be
            ``None`` for probabilities.
        ignore_index: target index left out (indices only); default ``-100``. With
            probabilities a sample is ignored by giving it zero probability.
        reduce: deprecated torch argument, as ``size_average``.
        reduction: ``'mean'`` (default), ``'sum'`` or ``'none'`` (a loss per sample ``[N]`` /
            ``[N, d_1, ...]``).

    Returns:
        The loss: a 0-d tensor, or per sample with ``reduction='none'``.

    Raises:
        ValueError: an unknown ``reduction``; ``size_average``/``reduce`` with dense targets;
            dense targets whose total probability is zero (with ``'mean'``).
    """
    if infer_target_type(input, target) == "indices":
        return F.cross_entropy(input, target, weight, size_average, ignore_index, reduce,
                               reduction)
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction {reduction!r} is not one of {list(_REDUCTIONS)}.")
    if size_average is not None or reduce is not None:
        raise ValueError("size_average and reduce are deprecated; use reduction= instead.")
    if ignore_index != -100:
        warnings.warn("ignore_index is not used with dense (probability) targets; samples "
                      "with zero total probability are ignored instead.", stacklevel=2)
    xentropy = -(target * F.log_softmax(input, dim=1))  # [N, C, d_1, ...]
    if weight is not None:
        shape = [1, -1] + [1] * (input.ndim - 2)  # broadcast [C] along dim 1
        xentropy = xentropy * weight.view(shape)
    xentropy = xentropy.sum(dim=1)  # [N, d_1, ...]
    if reduction == "sum":
        return xentropy.sum()
    if reduction == "none":
        return xentropy
    num_examples = xentropy.numel()
    total_prob = target.sum()
    if total_prob <= 0:
        raise ValueError("soft_cross_entropy: no target has nonzero probability.")
    if total_prob < num_examples * (1 - 1e-4):  # rows of mixed/smoothed targets round
        warnings.warn("soft_cross_entropy: some targets sum to less than 1; the mean is "
                      "taken over the total target probability.", stacklevel=2)
    return xentropy.mean() * (num_examples / total_prob)


def binary_cross_entropy_with_logits(
    input: torch.Tensor,
    target: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    reduction: str = "sum",
    pos_weight: Optional[torch.Tensor] = None,
    scale_by_batch_size: bool = True,
) -> torch.Tensor:
    """:func:`torch.nn.functional.binary_cross_entropy_with_logits` for multi-label
    classification that also takes class indices (one-hot encoded first), by default summed
    over classes and divided by the batch size (Composer's defaults).

    Args:
        input: logits ``[N, C, ...]``.
        target: labels in ``[0, 1]`` of ``input``'s shape, or class indices ``[N, ...]``.
        weight: a rescaling weight broadcast to the loss; default none.
        reduction: ``'sum'`` (default), ``'mean'`` or ``'none'``.
        pos_weight: weight of positive examples per class ``[C]``; default none.
        scale_by_batch_size: divide the reduced loss by ``N``; default ``True``.

    Raises:
        ValueError: an unknown ``reduction``; a target that fits neither form.
    """
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction {reduction!r} is not one of {list(_REDUCTIONS)}.")
    target = ensure_targets_one_hot(input, target)
    loss = F.binary_cross_entropy_with_logits(input, target, weight=weight, reduction=reduction,
                                              pos_weight=pos_weight)
    return loss / input.shape[0] if scale_by_batch_size else loss


class DiceLoss(_Loss):
    r"""Soft Dice loss for segmentation, :math:`1 - (2|X \cap Y| + \epsilon) / (|X| + |Y| +
    \epsilon)` per sample and class (Milletari et al. 2016, "V-Net"; the options follow
    MONAI's ``DiceLoss``), with :math:`\epsilon = 10^{-5}`.

    Pixels whose target is all zeros (an ignore index in index targets) do not count in
    ``|X|``.

    Args:
        sigmoid: apply a sigmoid to the input first; default ``False``.
        softmax: apply a softmax over classes first; default ``False`` (not with ``sigmoid``).
        squared_pred: square input and target in the denominator; default ``False``.
        jaccard: the soft Jaccard (IoU) loss instead of Dice; default ``False``.
        batch: sum over the batch before dividing (one value per class) instead of one per
            sample and class; default ``False``.
        ignore_absent_classes: leave out classes absent from the target; default ``False``.
        reduction: ``'mean'`` (default), ``'sum'``, ``'none'`` (``[N, C]``, or ``[C]`` with
            ``batch``).

    Shapes: input ``[N, C, d_1, ...]``; target indices ``[N, d_1, ...]`` or the input's shape.

    Raises:
        ValueError: ``sigmoid`` and ``softmax`` both set; an unknown ``reduction``.
    """

    def __init__(self, sigmoid: bool = False, softmax: bool = False, squared_pred: bool = False,
                 jaccard: bool = False, batch: bool = False, ignore_absent_classes: bool = False,
                 reduction: str = "mean") -> None:
        if sigmoid and softmax:
            raise ValueError("DiceLoss: give sigmoid=True or softmax=True, not both.")
        if reduction not in _REDUCTIONS:
            raise ValueError(f"DiceLoss reduction {reduction!r} is not one of {list(_REDUCTIONS)}.")
        super().__init__(reduction=reduction)
        self.sigmoid, self.softmax, self.squared_pred = sigmoid, softmax, squared_pred
        self.jaccard, self.batch, self.ignore_absent_classes = jaccard, batch, ignore_absent_classes

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        target = ensure_targets_one_hot(input, target)
        has_target = target.sum(dim=1, keepdim=True) != 0  # [N, 1, ...]
        if self.sigmoid:
            input = torch.sigmoid(input)
        elif self.softmax:
            if input.shape[1] == 1:
                warnings.warn("DiceLoss: softmax over a single channel is skipped.", stacklevel=2)
            else:
                input = torch.softmax(input, dim=1)
        dims = list(range(2, input.ndim))
        if self.batch:
            dims = [0] + dims
        overlap = (input * target).sum(dim=dims)
        if self.squared_pred:
            input, target = input * input, target * target
        predicted = (input * has_target).sum(dim=dims)
        actual = target.sum(dim=dims)
        total = predicted + actual
        if self.jaccard:
            total = 2.0 * (total - overlap)
        loss = 1.0 - (2.0 * overlap + 1e-5) / (total + 1e-5)
        if self.ignore_absent_classes:
            loss = loss[actual > 0] if self.batch else loss[:, actual.sum(dim=0) > 0]
        if self.reduction == "mean":
            return loss.mean()
        if self.reduction == "sum":
            return loss.sum()
        return loss


#: Loss functions by name, as Composer's ``composer.loss.loss_registry``.
loss_registry: dict[str, Callable[..., torch.Tensor]] = {
    "binary_cross_entropy_with_logits": binary_cross_entropy_with_logits,
    "soft_cross_entropy": soft_cross_entropy,
}
