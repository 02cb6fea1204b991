"""Label smoothing: train against ``(1 - smoothing) * one_hot + smoothing / C`` instead of
one-hot targets.

Shapes: ``N`` = samples, ``C`` = classes (the vocabulary for a language model), ``T`` =
positions.

Source: Szegedy et al., "Rethinking the Inception Architecture for Computer Vision", CVPR
2016, section 7; MosaicML Composer's ``LabelSmoothing`` / ``smooth_labels``
(``composer/algorithms/label_smoothing/label_smoothing.py``): same arguments, defaults and
events.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

import torch

from cadence.registry import algorithms
from cadence.core import Algorithm, Event, State
from cadence.utils.batch_helpers import batch_get, batch_set

__all__ = ["LabelSmoothing", "smooth_labels"]

IGNORE_INDEX = -100


def _class_dim(logits: torch.Tensor, target: torch.Tensor) -> int:
    """Where the classes are in ``logits`` for index ``target``s: dim 1 (PyTorch's
    ``[N, C, d_1, ...]``, Composer's) when the shapes fit it, else the last dim (a language
    model's ``[N, T, C]`` against ``[N, T]``)."""
    shape = tuple(logits.shape)
    if tuple(target.shape) == shape[:1] + shape[2:]:
        return 1
    if tuple(target.shape) == shape[:-1]:
        return logits.ndim - 1
    raise ValueError(f"smooth_labels: target of shape {tuple(target.shape)} fits neither "
                     f"logits {shape} with classes at dim 1 ([N, C, ...] against [N, ...]) nor "
                     f"at the last dim ([N, T, C] against [N, T]).")


def smooth_labels(logits: torch.Tensor, target: torch.Tensor,
                  smoothing: float = 0.1) -> torch.Tensor:
    """Smoothed class probabilities: ``(1 - smoothing) * one_hot(target) + smoothing / C``.

    Args:
        logits: the model's output, ``[N, C]``, ``[N, C, d_1, ...]`` or a language model's
            ``[N, T, C]``; only its shape (and device) is read.
        target: class indices ``[N]`` / ``[N, d_1, ...]`` / ``[N, T]`` (``-100`` marks an
            ignored position, as a language model's labels), or probabilities of
            ``logits``' shape (one-hot or already soft).
        smoothing: the probability mass spread evenly over the ``C`` classes, in
            ``[0, 1]``; default 0.1.

    Returns:
        Float probabilities of ``logits``' shape. Each row sums to 1, except ignored
        positions (index ``-100``, or an all-zero probability row), which are all zeros so
        that :func:`~cadence.loss.soft_cross_entropy` leaves them out.

    Raises:
        ValueError: ``smoothing`` outside ``[0, 1]``; a ``target`` shape that fits
            ``logits`` neither as indices nor as probabilities; an index outside
            ``[0, C)`` other than ``-100``.
    """
    if not 0.0 <= smoothing <= 1.0:
        raise ValueError(f"smooth_labels: smoothing must be in [0, 1], got {smoothing}.")
    dtype = logits.dtype if logits.is_floating_point() else torch.float32
    if target.shape == logits.shape:  # probabilities already
        dim = 1
        probs = target.to(dtype)
        keep = probs.sum(dim=dim, keepdim=True) > 0
    else:
        dim = _class_dim(logits, target)
        if target.is_floating_point():
            raise ValueError("smooth_labels: index targets must be integers; got "
                             f"{target.dtype} of shape {tuple(target.shape)}.")
        ignored = target == IGNORE_INDEX
        index = target.masked_fill(ignored, 0).long()
        probs = torch.zeros(logits.shape, dtype=dtype, device=logits.device)
        probs.scatter_(dim, index.unsqueeze(dim), 1.0)  # raises on an index >= C
        keep = ~ignored.unsqueeze(dim)
    classes = logits.shape[dim]
    smoothed = probs * (1.0 - smoothing) + smoothing / classes
    return smoothed * keep


def _logits(outputs: Any) -> torch.Tensor:
    """The logits in a model's outputs: a tensor, or ``outputs["logits"]`` / ``.logits``."""
    if isinstance(outputs, torch.Tensor):
        return outputs
    found = outputs.get("logits") if isinstance(outputs, Mapping) else getattr(outputs, "logits",
                                                                               None)
    if not isinstance(found, torch.Tensor):
        raise TypeError(f"LabelSmoothing needs the model's outputs to be the logits tensor or "
                        f"to hold 'logits'; got {type(outputs).__name__}.")
    return found


@algorithms.register("label_smoothing")
class LabelSmoothing(Algorithm):
    """Smooths the targets the loss sees (Szegedy et al. 2016).

    At ``BEFORE_LOSS`` the batch's targets (``batch[target_key]``: ``[N]`` class ids,
    ``[N, T]`` token labels with ``-100`` ignored, or ``[N, C]`` probabilities) are
    replaced by :func:`smooth_labels` of the model's logits (``[N, C]`` / ``[N, T, C]``);
    at ``AFTER_LOSS`` the original targets are put back, so train metrics see the true
    labels. The model's ``loss`` must take class probabilities:
    :class:`~cadence.models.HuggingFaceModel` does (for a causal LM the probabilities are
    shifted with the logits, as its own loss shifts labels), and so does
    :func:`~cadence.loss.soft_cross_entropy`.

    The smoothed targets have the logits' shape and dtype: for a language model that is
    one float per vocabulary entry per token (``N * T * C``), the size of the logits again.

    Args:
        smoothing: the mass spread evenly over the classes, in ``[0, 1]``; default 0.1.
        target_key: where the targets are in the batch (see
            :func:`cadence.utils.batch_helpers.batch_get`): default ``1``, the second item of
            an ``(inputs, targets)`` batch; ``"labels"`` for a dict batch such as a language
            model's ``{"input_ids", "labels"}``.

    Raises:
        ValueError: ``smoothing`` outside ``[0, 1]``. At ``BEFORE_LOSS``: a ``target_key``
            the batch does not have (the message says which key to pass).

    Example (YAML)::

        algorithms:
          label_smoothing: {smoothing: 0.1, target_key: labels}
    """

    events = frozenset({Event.BEFORE_LOSS, Event.AFTER_LOSS})

    def __init__(self, smoothing: float = 0.1, target_key: Any = 1) -> None:
        if not 0.0 <= smoothing <= 1.0:
            raise ValueError(f"LabelSmoothing: smoothing must be in [0, 1], got {smoothing}.")
        self.smoothing = float(smoothing)
        self.target_key = target_key
        self.original_labels: Optional[torch.Tensor] = None

    def match(self, event: Event, state: State) -> bool:
        return event in (Event.BEFORE_LOSS, Event.AFTER_LOSS)

    def _targets(self, batch: Any) -> torch.Tensor:
        try:
            labels = batch_get(batch, self.target_key)
        except (KeyError, IndexError, AttributeError, TypeError):
            hint = (" For a dict batch pass target_key='labels' (the batch's keys: "
                    f"{sorted(map(str, batch))})." if isinstance(batch, Mapping) else "")
            raise ValueError(f"LabelSmoothing: the batch has no target_key={self.target_key!r}."
                             f"{hint}") from None
        if not isinstance(labels, torch.Tensor):
            raise TypeError(f"LabelSmoothing: batch[{self.target_key!r}] must be a tensor, got "
                            f"{type(labels).__name__}.")
        return labels

    def apply(self, event: Event, state: State, logger: Any) -> None:
        if event == Event.BEFORE_LOSS:
            labels = self._targets(state.batch)
            self.original_labels = labels
            smoothed = smooth_labels(_logits(state.outputs), labels, self.smoothing)
            state.batch = batch_set(state.batch, self.target_key, smoothed)
        elif self.original_labels is not None:
            state.batch = batch_set(state.batch, self.target_key, self.original_labels)
            self.original_labels = None
