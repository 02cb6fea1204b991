"""Models: the :class:`ComposerModel` interface, the ``transformers`` wrapper and builders.

The built-in model builders (``gpt2``, ``hf_pretrained``) live in :mod:`cadence.models.gpt`
and register in :data:`cadence.trainer.registry.models` when it is imported (the registry
imports it on first look-up). Everything that needs ``transformers`` or ``torchmetrics`` is
imported on first access, so ``import cadence`` stays fast.
"""

from __future__ import annotations

import importlib
from typing import Any

from cadence.models.base import ComposerModel

__all__ = [
    "ComposerModel",
    "HuggingFaceModel",
    "LanguageCrossEntropy",
    "LanguagePerplexity",
    "gpt2",
    "hf_pretrained",
    "is_causal_lm",
    "is_sequence_classifier",
    "load_tokenizer",
    "metrics",
]

_LAZY = {
    "HuggingFaceModel": "cadence.models.huggingface",
    "is_causal_lm": "cadence.models.huggingface",
    "is_sequence_classifier": "cadence.models.huggingface",
    "LanguageCrossEntropy": "cadence.models.metrics",
    "LanguagePerplexity": "cadence.models.metrics",
    "gpt2": "cadence.models.gpt",
    "hf_pretrained": "cadence.models.gpt",
    "load_tokenizer": "cadence.models.gpt",
}


def __getattr__(name: str) -> Any:
    if name == "metrics":
        return importlib.import_module("cadence.models.metrics")
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'cadence.models' has no attribute {name!r}")
