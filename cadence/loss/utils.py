"""Target helpers shared by the losses and the batch-mixing algorithms (Composer's
``composer.loss.utils``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["ensure_targets_one_hot", "infer_target_type"]


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


def ensure_targets_one_hot(input: torch.Tensor, targets: torch.Tensor,
                           num_classes: int | None = None) -> torch.Tensor:
    """``targets`` as class probabilities of ``input``'s shape ``[N, C, d_1, ...]`` (float).

    Class indices ``[N, d_1, ...]`` are one-hot encoded along dim 1; an index below 0 (an
    ignore index such as -100) gets a row of zeros, which
    :func:`~cadence.loss.soft_cross_entropy` and :class:`~cadence.loss.DiceLoss` treat as
    "no target". Dense targets pass through as float.

    Args:
        input: ``[N, C, ...]`` logits or probabilities (only its shape is read).
        targets: indices ``[N, ...]`` or probabilities ``[N, C, ...]``.
        num_classes: ``C``; default ``input.shape[1]``.

    Raises:
        ValueError: ``targets`` fits neither form.
    """
    if infer_target_type(input, targets) == "one_hot":
        return targets.float()
    classes = input.shape[1] if num_classes is None else num_classes
    valid = targets >= 0
    one_hot = F.one_hot(targets.clamp(min=0).long(), classes).to(input.dtype
                                                                 if input.is_floating_point()
                                                                 else torch.float32)
    return (one_hot * valid.unsqueeze(-1)).movedim(-1, 1)
