"""``cadence.metrics``: Composer's ``composer.metrics`` path for the torchmetrics of
:mod:`cadence.models.metrics` (where they live)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cadence._lazy import lazy_exports

if TYPE_CHECKING:
    from cadence.models.metrics import (
        CrossEntropy, LanguageCrossEntropy, LanguagePerplexity, LossMetric, MaskedAccuracy,
    )

__all__ = ["CrossEntropy", "LanguageCrossEntropy", "LanguagePerplexity", "LossMetric",
           "MaskedAccuracy"]

# torchmetrics (and the transformers it pulls in) is imported on first use of a metric.
__getattr__, __dir__ = lazy_exports(__name__, dict.fromkeys(__all__, "cadence.models.metrics"))
