"""Algorithms: each module holds a functional form and a thin :class:`~cadence.Algorithm`.

Registered names (YAML ``algorithms:`` keys): ``activation_checkpointing``, ``child_tuning``,
``ema``, ``gradient_clipping``, ``mixed_precision``. Each is imported on first use; the
registry imports them all on its first look-up (:data:`_REGISTERING_MODULES`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cadence._lazy import lazy_exports

if TYPE_CHECKING:
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

_LAZY = {
    "ActivationCheckpointing": "cadence.algorithms.activation_checkpointing",
    "apply_activation_checkpointing": "cadence.algorithms.activation_checkpointing",
    "remove_activation_checkpointing": "cadence.algorithms.activation_checkpointing",
    "ChildTuning": "cadence.algorithms.child_tuning",
    "child_tuning_d_mask_": "cadence.algorithms.child_tuning",
    "child_tuning_f_mask_": "cadence.algorithms.child_tuning",
    "fisher_information": "cadence.algorithms.child_tuning",
    "fisher_mask": "cadence.algorithms.child_tuning",
    "top_fraction_threshold": "cadence.algorithms.child_tuning",
    "EMA": "cadence.algorithms.ema",
    "compute_ema": "cadence.algorithms.ema",
    "smoothing_from_half_life": "cadence.algorithms.ema",
    "ClippingType": "cadence.algorithms.gradient_clipping",
    "GradientClipping": "cadence.algorithms.gradient_clipping",
    "apply_gradient_clipping": "cadence.algorithms.gradient_clipping",
    "MixedPrecision": "cadence.algorithms.mixed_precision",
}

#: The modules whose import registers the algorithms in
#: :data:`cadence.config.registry.algorithms` (the registry imports them on first look-up).
_REGISTERING_MODULES = tuple(sorted(set(_LAZY.values())))

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
