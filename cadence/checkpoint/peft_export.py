"""Export a ``peft`` model's checkpoint: the adapter in ``peft``'s own format, or the merged
full model.

A checkpoint of a :class:`~cadence.models.HuggingFaceModel` with ``peft_config`` records in
its metadata (:func:`peft_metadata`, written by the Trainer with the rest of
``huggingface_metadata``) the base model's class and config, the adapter's ``PeftConfig``
(JSON) and where the base came from. Export then rebuilds the ``peft`` model in one process:

- an adapter-only checkpoint (``should_save_peft_only``) reads the frozen base again from the
  recorded directory (refused, naming both checksums, when its weights are not the ones the
  run trained on), then loads the adapter weights;
- a full checkpoint builds the base from the config and loads every weight.

and writes either ``PeftModel.save_pretrained`` (``adapter_config.json`` +
``adapter_model.safetensors``, loadable with ``peft.PeftModel.from_pretrained(base, folder)``)
or, with ``merge``, ``merge_and_unload()`` then ``save_pretrained`` (``config.json`` +
``model.safetensors``, loadable with ``from_pretrained`` and no ``peft``); the tokenizer, when
the run had one, in both.

``cadence convert CHECKPOINT --to hf OUT [--merge]``
(:func:`cadence.checkpoint.export.to_huggingface`) reads the checkpoint, then calls
:func:`peft_model_from_state` and :func:`save_peft`.

Source: ``peft``'s ``PeftModel.save_pretrained``, ``merge_and_unload`` and
``PeftModel.from_pretrained``.
"""

from __future__ import annotations

import enum
import os
from pathlib import Path
from typing import Any

from torch import nn

__all__ = ["PEFT_METADATA_KEY", "peft_metadata", "peft_base_model", "peft_model_from_state",
           "save_peft"]

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


def _peft_config(saved: dict[str, Any]) -> Any:
    from cadence.models.peft import peft_config_class

    kwargs = dict(saved)
    kwargs.pop("base_model_name_or_path", None)  # peft takes it from the base; set after
    config_class = peft_config_class(str(kwargs.pop("peft_type")))
    fields = {f for f in config_class.__dataclass_fields__
              if config_class.__dataclass_fields__[f].init}
    return config_class(**{k: v for k, v in kwargs.items() if k in fields})


def peft_model_from_state(weights: dict[str, Any], metadata: dict[str, Any], hf_class: Any,
                          hf_config: dict[str, Any], checkpoint: Path) -> Any:
    """The ``peft.PeftModel`` a checkpoint holds, weights loaded, in eval mode.

    Args:
        weights: the checkpoint's model weights, keys relative to the ``transformers`` model
            (``HuggingFaceModel``'s ``model.`` prefix removed): ``base_model.model....``.
        metadata: the checkpoint's metadata (with :data:`PEFT_METADATA_KEY`, and
            ``adapter_only`` for an adapter-only checkpoint).
        hf_class: the base's ``transformers`` class.
        hf_config: the base's config (JSON dict with ``model_type``).
        checkpoint: its path, for messages.

    Raises:
        CheckpointError: no ``peft`` metadata; an adapter-only checkpoint whose base is not a
            local directory or whose base weights changed (both checksums named); weights
            that do not fit (naming keys).
    """
    import transformers

    from cadence.checkpoint.adapter_only import METADATA_KEY as ADAPTER_ONLY
    from cadence.checkpoint.checkpoint import CheckpointError
    from cadence.models.peft import base_identity, wrap_with_peft

    saved = metadata.get(PEFT_METADATA_KEY)
    if not saved:
        raise CheckpointError(f"{checkpoint} holds no peft adapter (its metadata has no "
                              f"{PEFT_METADATA_KEY!r}); export it without --merge.")
    adapter_only = bool(metadata.get(ADAPTER_ONLY))
    if adapter_only:
        recorded = dict((metadata[ADAPTER_ONLY] or {}).get("base") or {})
        where = saved.get("base_name_or_path") or recorded.get("name_or_path") or ""
        if not where or not os.path.isdir(where):
            raise CheckpointError(
                f"{checkpoint} holds only the adapter; its frozen base {where or '(unnamed)'!r} "
                f"is not a local directory, so there is nothing to put the adapter on. Export "
                f"a checkpoint saved with should_save_peft_only=False, or restore the base.")
        base = hf_class.from_pretrained(where, local_files_only=True)
        now = base_identity(base, where)
        if recorded.get("crc32c") and now["crc32c"] != recorded["crc32c"]:
            raise CheckpointError(
                f"{checkpoint} was trained on the base {where} with CRC32C "
                f"{recorded['crc32c']} of its {recorded.get('over', 'weights')}; that "
                f"directory now has CRC32C {now['crc32c']}. Restore the original base.")
    else:
        config_dict = dict(hf_config)
        config = transformers.AutoConfig.for_model(config_dict.pop("model_type"), **config_dict)
        base = hf_class(config)
        where = saved.get("base_name_or_path") or ""
    model = wrap_with_peft(base, _peft_config(saved["config"]))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    adapter_keys = {n for n, p in model.named_parameters() if p.requires_grad}
    tied = {f"base_model.model.{k}" for k in (getattr(base, "_tied_weights_keys", None) or [])}
    missing = [k for k in missing if k not in tied and (k in adapter_keys or not adapter_only)]
    if missing or unexpected:
        raise CheckpointError(f"{checkpoint}: weights do not fit the peft model (missing "
                              f"{missing[:5]}, unexpected {unexpected[:5]}).")
    model.peft_config[model.active_adapter].base_model_name_or_path = where or None
    return model.eval()


def save_peft(model: Any, out_dir: Path, merge: bool = False, tokenizer: Any = None) -> Path:
    """Write ``model`` (a ``peft.PeftModel``) to ``out_dir``: the adapter
    (``save_pretrained``: ``adapter_config.json`` + ``adapter_model.safetensors``) or, with
    ``merge``, the merged full model (``merge_and_unload().save_pretrained``); and
    ``tokenizer`` when given.

    Returns:
        ``out_dir``.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    if merge:
        model.merge_and_unload().save_pretrained(out_dir, safe_serialization=True)
    else:
        model.save_pretrained(out_dir, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    return out_dir
