"""Composer's ``composer.algorithms.stochastic_depth``: the names of :mod:`cadence.algorithms.stochastic_depth.stochastic_depth`, read lazily."""

from __future__ import annotations

from cadence._lazy import lazy_exports

#: public name -> the module that defines it
_LAZY = {
    "StochasticBottleneck": "cadence.algorithms.stochastic_depth.stochastic_depth",
    "StochasticDepth": "cadence.algorithms.stochastic_depth.stochastic_depth",
    "apply_stochastic_depth": "cadence.algorithms.stochastic_depth.stochastic_depth",
    "is_resnet_bottleneck": "cadence.algorithms.stochastic_depth.stochastic_depth",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
