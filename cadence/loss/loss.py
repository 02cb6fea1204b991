"""Cross entropy that takes class indices or class probabilities (one-hot, smoothed, mixed).

Shapes: ``N`` = samples, ``C`` = classes, ``d_1 ... d_K`` = optional extra dimensions
(pixels, positions).

Source: MosaicML Composer's ``soft_cross_entropy`` (``composer/loss/loss.py``) and
``infer_target_type`` (``composer/loss/utils.py``); same arguments, defaults and maths.
"""

from __future__ import annotations

import warnings
from typing import Callable, Optional

import torch
import torch.nn.functional as F

__all__ = ["infer_target_type", "loss_registry", "soft_cross_entropy"]

_REDUCTIONS = ("mean", "sum", "none")


def infer_target_type(input: torch.Tensor, target: torch.Tensor) -> str:
    """``'one_hot'`` when ``target`` has ``input``'s shape (probabilities per class), else
    ``'indices'`` when it has one dimension fewer (a class index per sample).

    Raises:
        ValueError: ``target``'s shape fits neither.
    """
    if input.shape == target.shape:
        return "one_hot"
    if input.ndim == target.ndim + 1:
        return "indices"
    raise ValueError(
        f"Cannot tell the target type: input has shape {tuple(input.shape)}, target "
        f"{tuple(target.shape)}. Give class indices of shape (N, d_1, ...) or class "
        f"probabilities of the input's shape (N, C, d_1, ...)."
    )


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
    if total_prob < num_examples:
        warnings.warn("soft_cross_entropy: some targets sum to less than 1; the mean is "
                      "taken over the total target probability.", stacklevel=2)
    return xentropy.mean() * (num_examples / total_prob)


#: Loss functions by name, as Composer's ``composer.loss.loss_registry``.
loss_registry: dict[str, Callable[..., torch.Tensor]] = {
    "soft_cross_entropy": soft_cross_entropy,
}
