"""What a ``peft`` model's checkpoint records so that it can be exported later: the
adapter's ``PeftConfig`` (JSON) and where the base came from (:func:`peft_metadata`, written
by the Trainer with the rest of :func:`~cadence.checkpoint.export.huggingface_metadata`).
Reading it back and rebuilding the ``peft`` model is :mod:`cadence.models.hf_export`'s.
"""

from __future__ import annotations

import enum
from typing import Any

from torch import nn

__all__ = ["PEFT_METADATA_KEY", "peft_metadata", "peft_base_model"]

PEFT_METADATA_KEY = "hf_peft"
"""Checkpoint metadata key: ``{"config": PeftConfig as JSON, "base_name_or_path": str}``."""


def _jsonable(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (set, frozenset)):
        return sorted(_jsonable(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


def peft_base_model(inner: nn.Module) -> nn.Module:
    """The ``transformers`` model inside a ``peft.PeftModel`` (``inner`` itself otherwise)."""
    get_base = getattr(inner, "get_base_model", None)
    return get_base() if callable(get_base) and hasattr(inner, "peft_config") else inner


def peft_metadata(inner: nn.Module) -> dict[str, Any]:
    """``{PEFT_METADATA_KEY: {"config", "base_name_or_path"}}`` for a ``peft.PeftModel``
    with one adapter, else ``{}``.

    Raises:
        ValueError: the model holds several adapters (export handles one).
    """
    configs = getattr(inner, "peft_config", None)
    if not isinstance(configs, dict) or not hasattr(inner, "get_base_model"):
        return {}
    if len(configs) != 1:
        raise ValueError(f"peft export handles one adapter; the model has {sorted(configs)}.")
    config = next(iter(configs.values()))
    base = peft_base_model(inner)
    return {PEFT_METADATA_KEY: {
        "config": _jsonable(config.to_dict()),
        "base_name_or_path": str(getattr(base, "name_or_path", "") or ""),
    }}
