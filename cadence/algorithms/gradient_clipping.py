"""Gradient clipping by total norm or by value, applied once per batch after accumulation.

Source: Pascanu et al., "On the difficulty of training recurrent neural networks", ICML 2013
(norm clipping); PyTorch's ``torch.nn.utils.clip_grad_norm_`` / ``clip_grad_value_``.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Iterable

import torch

from cadence.trainer.core import Algorithm, Event, State
from cadence.trainer.registry import algorithms

__all__ = ["ClippingType", "GradientClipping", "apply_gradient_clipping"]


class ClippingType(str, Enum):
    """``norm``: rescale all gradients so their total L2 norm is at most the threshold;
    ``value``: clamp each gradient entry to ``[-threshold, threshold]``."""

    NORM = "norm"
    VALUE = "value"


def apply_gradient_clipping(
    parameters: Iterable[torch.nn.Parameter], clipping_type: str, clipping_threshold: float
) -> torch.Tensor | None:
    """Clip the gradients of ``parameters`` in place.

    Args:
        parameters: parameters whose ``.grad`` is clipped (those without a gradient are skipped).
        clipping_type: ``"norm"`` or ``"value"``.
        clipping_threshold: the max total L2 norm, or the max absolute value; > 0.

    Returns:
        The total gradient norm before clipping (a 0-d tensor) for ``norm``, else ``None``.

    Raises:
        ValueError: unknown ``clipping_type`` or a non-positive threshold.
    """
    kind = _parse_type(clipping_type)
    if clipping_threshold <= 0:
        raise ValueError(f"clipping_threshold must be > 0, got {clipping_threshold}.")
    params = [p for p in parameters if p.grad is not None]
    if kind == ClippingType.NORM:
        return torch.nn.utils.clip_grad_norm_(params, max_norm=clipping_threshold)
    torch.nn.utils.clip_grad_value_(params, clip_value=clipping_threshold)
    return None


def _parse_type(clipping_type: str) -> ClippingType:
    try:
        return ClippingType(clipping_type)
    except ValueError:
        allowed = ", ".join(t.value for t in ClippingType)
        raise ValueError(f"clipping_type {clipping_type!r} is not one of: {allowed}.") from None


@algorithms.register("gradient_clipping")
class GradientClipping(Algorithm):
    """Clips gradients at ``AFTER_TRAIN_BATCH``, when they are final for the step.

    Args:
        clipping_type: ``"norm"`` (default) or ``"value"``.
        clipping_threshold: max total L2 norm, or max absolute entry; default 1.0.

    Example (YAML)::

        algorithms:
          gradient_clipping: {clipping_type: norm, clipping_threshold: 1.0}
    """

    events = frozenset({Event.AFTER_TRAIN_BATCH})

    def __init__(self, clipping_type: str = "norm", clipping_threshold: float = 1.0) -> None:
        self.clipping_type = _parse_type(clipping_type).value
        if clipping_threshold <= 0:
            raise ValueError(f"clipping_threshold must be > 0, got {clipping_threshold}.")
        self.clipping_threshold = float(clipping_threshold)

    def match(self, event: Event, state: State) -> bool:
        return event == Event.AFTER_TRAIN_BATCH

    def apply(self, event: Event, state: State, logger: Any) -> None:
        apply_gradient_clipping(
            state.model.parameters(), self.clipping_type, self.clipping_threshold
        )
