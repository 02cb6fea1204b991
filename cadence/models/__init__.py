"""Models: the :class:`ComposerModel` interface, the ``transformers`` wrapper and builders.

The built-in model builders (``gpt2``, ``hf_pretrained``) live in :mod:`cadence.models.gpt`
and register in :data:`cadence.registry.registry.models` when it is imported (the registry
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
    "Initializer",
    "LanguageCrossEntropy",
    "LanguagePerplexity",
    "LossMetric",
    "MaskedAccuracy",
    "gpt2",
    "hf_pretrained",
    "is_causal_lm",
    "is_sequence_classifier",
    "load_tokenizer",
    "tasks",
    "write_huggingface_pretrained_from_composer_checkpoint",
]

_LAZY = {
    "ComposerClassifier": "cadence.models.tasks.classification",
    "CrossEntropy": "cadence.metrics.metrics",
    "LossMetric": "cadence.metrics.metrics",
    "MaskedAccuracy": "cadence.metrics.nlp",
    "HuggingFaceModel": "cadence.models.huggingface",
    "Initializer": "cadence.models.initializers",
    "is_causal_lm": "cadence.models.huggingface",
    "is_sequence_classifier": "cadence.models.huggingface",
    "LanguageCrossEntropy": "cadence.metrics.nlp",
    "LanguagePerplexity": "cadence.metrics.nlp",
    "gpt2": "cadence.models.gpt",
    "hf_pretrained": "cadence.models.gpt",
    "load_tokenizer": "cadence.data.tokenizer",
    "write_huggingface_pretrained_from_composer_checkpoint": "cadence.models.huggingface",
}


__getattr__, __dir__ = lazy_exports(__name__, {**_LAZY, "tasks": "cadence.models.tasks"})
