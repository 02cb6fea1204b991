"""Composer's ``composer.algorithms.blurpool``: the algorithm (:mod:`.blurpool`) and its layers
(:mod:`.blurpool_layers`), read lazily."""

from __future__ import annotations

from cadence._lazy import lazy_exports

#: public name -> the module that defines it
_LAZY = {
    "BlurConv2d": "cadence.algorithms.blurpool.blurpool_layers",
    "BlurMaxPool2d": "cadence.algorithms.blurpool.blurpool_layers",
    "BlurPool": "cadence.algorithms.blurpool.blurpool",
    "BlurPool2d": "cadence.algorithms.blurpool.blurpool_layers",
    "apply_blurpool": "cadence.algorithms.blurpool.blurpool",
    "blur_2d": "cadence.algorithms.blurpool.blurpool_layers",
    "blurmax_pool2d": "cadence.algorithms.blurpool.blurpool_layers",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
