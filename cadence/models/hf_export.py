"""``cadence convert CHECKPOINT --to hf OUT [--merge]``: a checkpoint's ``transformers``
model written in Hugging Face's format (:func:`to_huggingface`); a ``peft`` model's
checkpoint as the adapter in ``peft``'s own format, or as the merged full model.

A checkpoint of a :class:`~cadence.models.HuggingFaceModel` with ``peft_config`` records in
its metadata (:func:`~cadence.checkpoint.peft_metadata.peft_metadata`, written by the Trainer with the rest of
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
(:func:`to_huggingface`) reads the checkpoint, then calls
:func:`peft_model_from_state` and :func:`save_peft`.

Source: ``peft``'s ``PeftModel.save_pretrained``, ``merge_and_unload`` and
``PeftModel.from_pretrained``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cadence.checkpoint.adapter_only import METADATA_KEY as ADAPTER_ONLY
from cadence.checkpoint.adapter_only import base_difference
from cadence.checkpoint.checkpoint import CheckpointError
from cadence.checkpoint.export import (
    HF_PREFIX, _hf_class, _hf_description, _hf_tokenizer, hf_model_from_checkpoint,
    load_full_state,
)
from cadence.checkpoint.peft_metadata import PEFT_METADATA_KEY
from cadence.models.peft import base_identity, peft_config_class, wrap_with_peft

__all__ = ["to_huggingface", "peft_model_from_state", "save_peft"]

def _peft_config(saved: dict[str, Any]) -> Any:
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
        difference = base_difference(recorded, now) if recorded.get("crc32c") else None
        if difference is not None:
            raise CheckpointError(
                f"{checkpoint} was trained on the base {where} with CRC32C "
                f"{recorded['crc32c']} of its {recorded.get('over', 'weights')}; that "
                f"directory now has CRC32C {now['crc32c']}{difference}. Restore the original "
                f"base.")
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


def to_huggingface(checkpoint: Path, out_dir: Path, merge: bool = False) -> Path:
    """Write the checkpoint's ``transformers`` model to ``out_dir``: ``model.safetensors``,
    ``config.json`` and, when the run had one, the tokenizer. A ``peft`` model's checkpoint
    gives its adapter in ``peft``'s format, or with ``merge`` the merged full model
    (:func:`peft_model_from_state`, :func:`save_peft`).

    Raises:
        CheckpointError: the checkpoint was not written from a ``HuggingFaceModel``;
            ``merge`` for a checkpoint without an adapter.
    """
    state = load_full_state(checkpoint)
    metadata = state.get("metadata") or {}
    if merge or PEFT_METADATA_KEY in metadata:
        described = _hf_description(state, checkpoint)
        weights = {k[len(HF_PREFIX):]: v for k, v in state["model"].items()
                   if k.startswith(HF_PREFIX)}
        model = peft_model_from_state(weights, metadata, _hf_class(described["class"]),
                                      described["config"], checkpoint)
        return save_peft(model, out_dir, merge, _hf_tokenizer(described["tokenizer"]))
    model, tokenizer = hf_model_from_checkpoint(checkpoint, state=state, strict=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    return out_dir
