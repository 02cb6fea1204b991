"""Models: the :class:`ComposerModel` interface, the ``transformers`` wrapper and builders.

The built-in model builders (``gpt2``, ``hf_pretrained``) live in :mod:`cadence.models.gpt`
and register in :data:`cadence.trainer.registry.models` when it is imported (the registry
imports it on first look-up). Everything that needs ``transformers`` or ``torchmetrics`` is
imported on first access, so ``import cadence`` stays fast.
"""

from __future__ import annotations

from cadence._lazy import lazy_exports
from cadence.models.base import ComposerModel

__all__ = [
    "ComposerClassifier",
    "ComposerModel",
    "CrossEntropy",
    "HuggingFaceModel",
    "LanguageCrossEntropy",
    "LanguagePerplexity",
    "LossMetric",
    "MaskedAccuracy",
    "gpt2",
    "hf_pretrained",
    "is_causal_lm",
    "is_sequence_classifier",
    "load_tokenizer",
    "metrics",
]

_LAZY = {
    "ComposerClassifier": "cadence.models.classifier",
    "CrossEntropy": "cadence.models.metrics",
    "LossMetric": "cadence.models.metrics",
    "MaskedAccuracy": "cadence.models.metrics",
    "HuggingFaceModel": "cadence.models.huggingface",
    "is_causal_lm": "cadence.models.huggingface",
    "is_sequence_classifier": "cadence.models.huggingface",
    "LanguageCrossEntropy": "cadence.models.metrics",
    "LanguagePerplexity": "cadence.models.metrics",
    "gpt2": "cadence.models.gpt",
    "hf_pretrained": "cadence.models.gpt",
    "load_tokenizer": "cadence.models.gpt",
}


__getattr__, __dir__ = lazy_exports(__name__, {**_LAZY, "metrics": "cadence.models.metrics"})
