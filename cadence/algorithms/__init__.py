"""Algorithms: each module holds a functional form and a thin :class:`~cadence.Algorithm`."""

from cadence.algorithms.gradient_clipping import (
    ClippingType, GradientClipping, apply_gradient_clipping,
)

__all__ = ["ClippingType", "GradientClipping", "apply_gradient_clipping"]
