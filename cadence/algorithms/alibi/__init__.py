"""Composer's ``composer.algorithms.alibi``: the names of :mod:`cadence.algorithms.alibi.alibi`, read lazily."""

from __future__ import annotations

from cadence._lazy import lazy_exports

#: public name -> the module that defines it
_LAZY = {
    "Alibi": "cadence.algorithms.alibi.alibi",
    "apply_alibi": "cadence.algorithms.alibi.alibi",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
