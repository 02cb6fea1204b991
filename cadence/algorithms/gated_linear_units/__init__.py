"""Composer's ``composer.algorithms.gated_linear_units``: the algorithm (:mod:`.gated_linear_units`)
and its layer (:mod:`.gated_linear_unit_layers`), read lazily."""

from __future__ import annotations

from cadence._lazy import lazy_exports

#: public name -> the module that defines it
_LAZY = {
    "BERTGatedFFOutput": "cadence.algorithms.gated_linear_units.gated_linear_unit_layers",
    "GatedLinearUnits": "cadence.algorithms.gated_linear_units.gated_linear_units",
    "apply_gated_linear_units": "cadence.algorithms.gated_linear_units.gated_linear_units",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
