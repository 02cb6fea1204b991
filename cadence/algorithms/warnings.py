"""Warnings the algorithms raise (Composer's ``composer.algorithms.warnings``).

:class:`NoEffectWarning` says an algorithm was asked to run but changed nothing: a surgery
found no module of the class it replaces, or a low-precision algorithm runs in ``fp32``.
Filter it with ``warnings.filterwarnings("ignore", category=NoEffectWarning)``.
"""

from __future__ import annotations

__all__ = ["NoEffectWarning"]


class NoEffectWarning(Warning):
    """An algorithm ran but left the model (or batch) unchanged; the message says why."""
