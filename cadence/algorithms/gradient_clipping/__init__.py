"""Composer's ``composer.algorithms.gradient_clipping``: the names of :mod:`cadence.algorithms.gradient_clipping.gradient_clipping`, read lazily."""

from __future__ import annotations

from cadence._lazy import lazy_exports

#: public name -> the module that defines it
_LAZY = {
    "ClippingType": "cadence.algorithms.gradient_clipping.gradient_clipping",
    "GradientClipping": "cadence.algorithms.gradient_clipping.gradient_clipping",
    "apply_gradient_clipping": "cadence.algorithms.gradient_clipping.gradient_clipping",
    "unitwise_norm": "cadence.algorithms.gradient_clipping.gradient_clipping",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
