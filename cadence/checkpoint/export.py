"""Export a checkpoint: merge a sharded one into one ``full`` file, or write a
``HuggingFaceModel``'s weights as ``model.safetensors`` + config (+ tokenizer), loadable by
``from_pretrained``. Runs in one process, no process group needed.

Source: ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save`` (DCP -> one file),
``transformers.PreTrainedModel.save_pretrained`` (safetensors).
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from cadence.checkpoint.checkpoint import (
    CheckpointError, SafeLoadPlanner, describe_dcp_failure, load_verified, not_loadable,
    safe_torch_load, verify,
)
from cadence.checkpoint.files import (
    EXTRA_FILE, is_complete, remove_checkpoint, temporary_path,
)
from cadence.checkpoint.safe_unpickle import SafeFileSystemReader
from cadence.checkpoint.writing import write_full_file

__all__ = ["huggingface_metadata", "load_full_state", "to_full", "to_huggingface"]

HF_PREFIX = "model."  # HuggingFaceModel keeps the transformers model at .model


def huggingface_metadata(model: torch.nn.Module) -> dict[str, Any]:
    """What export needs to rebuild a ``HuggingFaceModel``'s ``transformers`` model: its class
    name, config (JSON) and tokenizer (``tokenizer.json`` text and special tokens). Empty for
    other models."""
    if "transformers" not in sys.modules:
        return {}
    from transformers import PreTrainedModel

    module = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    inner = getattr(module, "model", None)
    if not isinstance(inner, PreTrainedModel):
        return {}
    meta: dict[str, Any] = {"hf_class": type(inner).__name__,
                            "hf_config": json.loads(inner.config.to_json_string())}
    tokenizer = getattr(module, "tokenizer", None)
    if tokenizer is not None:
        meta.update(_tokenizer_metadata(tokenizer))
    return meta


def _tokenizer_metadata(tokenizer: Any) -> dict[str, Any]:
    """``{"hf_tokenizer": {"tokenizer_json", "special_tokens"}}`` for a ``transformers``
    tokenizer: a fast one's ``tokenizer.json`` as is, a slow one (``GPT2Tokenizer``)
    converted with ``transformers.convert_slow_tokenizer``; ``{}`` when neither works."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        try:
            from transformers.convert_slow_tokenizer import convert_slow_tokenizer

            backend = convert_slow_tokenizer(tokenizer)
        except Exception:  # noqa: BLE001 - a tokenizer transformers cannot convert: none
            return {}
    specials = {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}
    return {"hf_tokenizer": {"tokenizer_json": backend.to_str(), "special_tokens": specials}}


class _SafeEmptyPlanner(SafeLoadPlanner, _EmptyStateDictLoadPlanner):
    """Rebuild the whole state dict from DCP metadata; non-tensors load with weights_only
    (:class:`SafeLoadPlanner`'s ``load_bytes``)."""


def load_full_state(path: Path) -> dict[str, Any]:
    """The whole checkpoint at ``path`` as one in-memory dict of plain tensors (as a ``full``
    file holds it), from a full file or a sharded directory. Read as ``load_path`` reads it:
    pickles through the restricted unpicklers, every file checked against the CRC32Cs written
    with it before its tensors are used.

    Raises:
        CheckpointError: not a complete checkpoint, unreadable, a file that differs from its
            checksum, or an object that is not allowed in a checkpoint (naming the file).
    """
    path = Path(path)
    if not is_complete(path):
        raise CheckpointError(not_loadable(path))
    if path.is_file():
        return dict(load_verified(path, checksums=True))
    reader = SafeFileSystemReader(str(path))
    reader.read_metadata()  # the restricted unpickler's verdict first, then the checksums
    extra = safe_torch_load(path / EXTRA_FILE)
    verify(path)
    state: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled",
                                category=UserWarning)
        try:
            # not dcp.load: it copies back only the keys the given dict already has, so an
            # empty dict stays empty (torch's own dcp_to_torch_save calls this one too)
            _load_state_dict(state, storage_reader=reader, planner=_SafeEmptyPlanner(),
                             no_dist=True)
        except (Exception, CheckpointException) as exc:
            raise CheckpointError(f"Cannot read sharded checkpoint {path}: "
                                  f"{describe_dcp_failure(exc)}") from exc
    state.update(extra)
    return state


def to_full(checkpoint: Path, out: Path) -> Path:
    """Merge ``checkpoint`` (sharded or full) into one ``full`` file at ``out`` (atomically);
    it loads with ``load_path`` on any number of ranks, and carries its CRC32C."""
    state = load_full_state(checkpoint)
    state["metadata"] = {**state["metadata"], "format": "full"}
    tmp = temporary_path(out, "convert")
    try:
        write_full_file(state, out, tmp, run_name="convert")
        os.replace(tmp, out)
    except BaseException:
        remove_checkpoint(tmp)
        raise
    return out


def to_huggingface(checkpoint: Path, out_dir: Path) -> Path:
    """Write the checkpoint's ``transformers`` model to ``out_dir``: ``model.safetensors``,
    ``config.json`` and, when the run had one, the tokenizer.

    Raises:
        CheckpointError: the checkpoint was not written from a ``HuggingFaceModel``.
    """
    import transformers
    from tokenizers import Tokenizer

    state = load_full_state(checkpoint)
    meta = state["metadata"]
    if "hf_class" not in meta:
        raise CheckpointError(f"{checkpoint} was not saved from a HuggingFaceModel (its metadata "
                              f"has no transformers config); export with --to full instead.")
    config_dict = dict(meta["hf_config"])
    config = transformers.AutoConfig.for_model(config_dict.pop("model_type"), **config_dict)
    model = getattr(transformers, meta["hf_class"])(config)
    weights = {k[len(HF_PREFIX):]: v for k, v in state["model"].items() if k.startswith(HF_PREFIX)}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise CheckpointError(f"{checkpoint}: weights do not fit {meta['hf_class']} (missing "
                              f"{missing[:5]}, unexpected {unexpected[:5]}).")
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer = meta.get("hf_tokenizer")
    if tokenizer is not None:
        fast = transformers.PreTrainedTokenizerFast(
            tokenizer_object=Tokenizer.from_str(tokenizer["tokenizer_json"]),
            **tokenizer["special_tokens"])
        fast.save_pretrained(out_dir)
    return out_dir
