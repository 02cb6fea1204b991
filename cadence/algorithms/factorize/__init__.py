"""Composer's ``composer.algorithms.factorize``: the algorithm (:mod:`.factorize`), the solvers
(:mod:`.factorize_core`) and the factorized modules (:mod:`.factorize_modules`), read lazily."""

from __future__ import annotations

from cadence._lazy import lazy_exports

#: public name -> the module that defines it
_LAZY = {
    "Factorize": "cadence.algorithms.factorize.factorize",
    "FactorizedConv2d": "cadence.algorithms.factorize.factorize_modules",
    "FactorizedLinear": "cadence.algorithms.factorize.factorize_modules",
    "LowRankSolution": "cadence.algorithms.factorize.factorize_core",
    "apply_factorization": "cadence.algorithms.factorize.factorize",
    "factorize_conv2d": "cadence.algorithms.factorize.factorize_core",
    "factorize_matrix": "cadence.algorithms.factorize.factorize_core",
    "factorizing_could_speedup": "cadence.algorithms.factorize.factorize_modules",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
