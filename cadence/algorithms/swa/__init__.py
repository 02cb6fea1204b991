"""Composer's ``composer.algorithms.swa``: the names of :mod:`cadence.algorithms.swa.swa`, read lazily."""

from __future__ import annotations

from cadence._lazy import lazy_exports

#: public name -> the module that defines it
_LAZY = {
    "SWA": "cadence.algorithms.swa.swa",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
