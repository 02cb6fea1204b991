"""Composer's ``composer.algorithms.no_op_model``: the names of :mod:`cadence.algorithms.no_op_model.no_op_model`, read lazily."""

from __future__ import annotations

from cadence._lazy import lazy_exports

#: public name -> the module that defines it
_LAZY = {
    "NoOpModel": "cadence.algorithms.no_op_model.no_op_model",
    "NoOpModelClass": "cadence.algorithms.no_op_model.no_op_model",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
