"""Composer's ``composer.models.tasks``: task wrappers around a plain ``nn.Module``
(:class:`ComposerClassifier`, in :mod:`cadence.models.tasks.classification`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cadence._lazy import lazy_exports

if TYPE_CHECKING:
    from cadence.models.tasks.classification import ComposerClassifier

__all__ = ["ComposerClassifier"]

__getattr__, __dir__ = lazy_exports(
    __name__, {"ComposerClassifier": "cadence.models.tasks.classification"})
