"""Algorithms: each module holds a functional form and a thin :class:`~cadence.Algorithm`.

Registered names (YAML ``algorithms:`` keys): ``activation_checkpointing``, ``child_tuning``,
``ema``, ``gradient_clipping``, ``mixed_precision``.
"""

from cadence.algorithms.activation_checkpointing import (
    ActivationCheckpointing, apply_activation_checkpointing, remove_activation_checkpointing,
)
from cadence.algorithms.child_tuning import (
    ChildTuning, child_tuning_d_mask_, child_tuning_f_mask_, fisher_information, fisher_mask,
    top_fraction_threshold,
)
from cadence.algorithms.ema import EMA, compute_ema, smoothing_from_half_life
from cadence.algorithms.gradient_clipping import (
    ClippingType, GradientClipping, apply_gradient_clipping,
)
from cadence.algorithms.mixed_precision import MixedPrecision

__all__ = [
    "ActivationCheckpointing", "ChildTuning", "ClippingType", "EMA", "GradientClipping",
    "MixedPrecision", "apply_activation_checkpointing", "apply_gradient_clipping",
    "child_tuning_d_mask_", "child_tuning_f_mask_", "compute_ema", "fisher_information",
    "fisher_mask", "remove_activation_checkpointing", "smoothing_from_half_life",
    "top_fraction_threshold",
]
