"""Composer's ``composer.metrics``: language-model metrics (:mod:`cadence.metrics.nlp`) and
general ones (:mod:`cadence.metrics.metrics`), all torchmetrics ``Metric`` s. Names are
imported on first use (torchmetrics, and the transformers it pulls in, load then)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cadence._lazy import lazy_exports

if TYPE_CHECKING:
    from cadence.metrics.metrics import CrossEntropy, Dice, LossMetric, MIoU
    from cadence.metrics.nlp import (
        BinaryF1Score, LanguageCrossEntropy, LanguagePerplexity, MaskedAccuracy,
    )

_LAZY = {
    "BinaryF1Score": "cadence.metrics.nlp",
    "CrossEntropy": "cadence.metrics.metrics",
    "Dice": "cadence.metrics.metrics",
    "MIoU": "cadence.metrics.metrics",
    "LossMetric": "cadence.metrics.metrics",
    "LanguageCrossEntropy": "cadence.metrics.nlp",
    "LanguagePerplexity": "cadence.metrics.nlp",
    "MaskedAccuracy": "cadence.metrics.nlp",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
