"""Composer's ``composer.algorithms.gyro_dropout``: the names of :mod:`cadence.algorithms.gyro_dropout.gyro_dropout`, read lazily."""

from __future__ import annotations

from cadence._lazy import lazy_exports

#: public name -> the module that defines it
_LAZY = {
    "GyroDropout": "cadence.algorithms.gyro_dropout.gyro_dropout",
    "GyroDropoutLayer": "cadence.algorithms.gyro_dropout.gyro_dropout",
    "apply_gyro_dropout": "cadence.algorithms.gyro_dropout.gyro_dropout",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
