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
from typing import Any, Optional

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
from cadence.checkpoint.model_fit import listed_keys
from cadence.checkpoint.safe_unpickle import SafeFileSystemReader
from cadence.checkpoint.writing import write_full_file
from cadence.utils.misc import unwrap_model

__all__ = ["hf_from_checkpoint_path", "hf_model_from_checkpoint", "huggingface_metadata",
           "load_full_state", "to_full"]

HF_PREFIX = "model."  # HuggingFaceModel keeps the transformers model at .model


def huggingface_metadata(model: torch.nn.Module) -> dict[str, Any]:
    """What export needs to rebuild a ``HuggingFaceModel``'s ``transformers`` model: its class
    name, config (JSON) and tokenizer (``tokenizer.json`` text and special tokens). Empty for
    other models."""
    if "transformers" not in sys.modules:
        return {}
    from transformers import PreTrainedModel

    from cadence.checkpoint.peft_metadata import peft_base_model, peft_metadata

    module = unwrap_model(model)
    inner = getattr(module, "model", None)
    peft = peft_metadata(inner) if inner is not None else {}  # a peft model: its base's class
    inner = peft_base_model(inner) if peft else inner
    if not isinstance(inner, PreTrainedModel):
        return {}
    meta: dict[str, Any] = {"hf_class": type(inner).__name__,
                            "hf_config": json.loads(inner.config.to_json_string()), **peft}
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


def _hf_description(state: dict[str, Any], checkpoint: Path) -> dict[str, Any]:
    """``{"class", "config", "tokenizer"}`` of the ``transformers`` model a checkpoint holds:
    from cadence's metadata (``hf_class``, ``hf_config``, ``hf_tokenizer``) or from
    Composer's ``integrations.huggingface`` (``model.config.content`` / ``class``, the
    tokenizer's files by name).

    Raises:
        CheckpointError: the checkpoint was not written from a ``HuggingFaceModel``.
    """
    meta = state.get("metadata") or {}
    if "hf_class" in meta:
        return {"class": meta["hf_class"], "config": dict(meta["hf_config"]),
                "tokenizer": meta.get("hf_tokenizer")}
    hf = (state.get("integrations") or {}).get("huggingface") or {}
    config = (hf.get("model") or {}).get("config") or {}
    if "content" not in config or "class" not in config:
        raise CheckpointError(f"{checkpoint} was not saved from a HuggingFaceModel (its metadata "
                              f"has no transformers config); export with --to full instead.")
    return {"class": config["class"], "config": dict(config["content"]),
            "tokenizer": hf.get("tokenizer")}


def _hf_tokenizer(saved: Any) -> Any:
    """The tokenizer a checkpoint holds, or None: cadence's (``tokenizer.json`` text and
    special tokens) or Composer's (its files by name, each ``{"file_extension", "content"}``,
    written to a temporary folder and read back with ``AutoTokenizer``)."""
    import tempfile

    import transformers

    if not saved:
        return None
    if "tokenizer_json" in saved:
        from tokenizers import Tokenizer

        return transformers.PreTrainedTokenizerFast(
            tokenizer_object=Tokenizer.from_str(saved["tokenizer_json"]),
            **saved.get("special_tokens", {}))
    with tempfile.TemporaryDirectory(prefix="cadence-tokenizer-") as tmp:
        for name, entry in saved.items():
            if not isinstance(entry, dict) or "content" not in entry:
                continue
            target = Path(tmp) / Path(f"{name}{entry.get('file_extension', '')}").name
            content = entry["content"]
            if isinstance(content, (dict, list)) and target.suffix == ".json":
                target.write_text(json.dumps(content))
            elif isinstance(content, list):  # a .txt file, one entry per line
                target.write_text("\n".join(content))
            elif isinstance(content, str):
                target.write_text(content)
        return transformers.AutoTokenizer.from_pretrained(tmp)


def _hf_class(name_or_class: Any) -> Any:
    """A ``transformers`` model class from a class, a class name (``GPT2LMHeadModel``) or a
    dotted path (Composer stores ``transformers.models.gpt2...GPT2LMHeadModel``)."""
    import transformers

    if not isinstance(name_or_class, str):
        return name_or_class
    cls = getattr(transformers, name_or_class.rsplit(".", 1)[-1], None)
    if cls is None:
        raise CheckpointError(f"transformers has no model class {name_or_class!r}.")
    return cls


def hf_model_from_checkpoint(checkpoint: Path, model_instantiation_class: Any = None,
                             model_config_kwargs: Optional[dict[str, Any]] = None,
                             trust_remote_code: bool = False,
                             state: Optional[dict[str, Any]] = None,
                             strict: bool = False) -> tuple[Any, Any]:
    """The ``transformers`` model (and tokenizer, or None) in the checkpoint ``checkpoint``
    (local; cadence's, full or sharded, or a full one Composer wrote), its weights loaded.

    Args:
        checkpoint: the checkpoint's local path.
        model_instantiation_class: the class to build (a class, or its name in
            ``transformers``; ``AutoModelFor...`` classes build through ``from_config``).
            Default: the class the checkpoint names.
        model_config_kwargs: config fields to override.
        trust_remote_code: passed to ``from_config`` of an ``AutoModel`` class.
        state: the checkpoint's state if already read (:func:`load_full_state`).
        strict: refuse keys only one side holds. Default False, as Composer's fine-tune
            flow needs (a new head on the pretrained body): what fits loads, one
            ``UserWarning`` names the rest.

    Raises:
        CheckpointError: not written from a ``HuggingFaceModel``; a weight of another shape
            (always) or, when ``strict``, keys only one side holds (naming the keys);
            besides :func:`load_full_state`'s.
    """
    import transformers

    state = load_full_state(checkpoint) if state is None else state
    described = _hf_description(state, checkpoint)
    config_dict = {**described["config"], **(model_config_kwargs or {})}
    config = transformers.AutoConfig.for_model(config_dict.pop("model_type"), **config_dict)
    cls = _hf_class(model_instantiation_class or described["class"])
    if hasattr(cls, "from_config") and not hasattr(cls, "config_class"):  # AutoModel...
        model = cls.from_config(config, trust_remote_code=trust_remote_code)
    else:
        model = cls(config)
    weights = {k[len(HF_PREFIX):]: v for k, v in state["model"].items() if k.startswith(HF_PREFIX)}
    _load_what_fits(model, weights, checkpoint, strict)
    return model, _hf_tokenizer(described["tokenizer"])


def _load_what_fits(model: torch.nn.Module, weights: dict[str, Any], checkpoint: Path,
                    strict: bool) -> None:
    """Load ``weights`` into ``model``: every key both hold, after checking their shapes.

    Keys only one side holds (a new head on a pretrained body: the model's ``score.weight``,
    the checkpoint's ``lm_head.weight``) are refused when ``strict``, else named in one
    ``UserWarning`` (the model's keep their initial values). A shape mismatch is always
    refused, nothing loaded.

    Raises:
        CheckpointError: naming up to ten keys of each kind (and both shapes).
    """
    own = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    shapes = sorted(k for k, v in weights.items()
                    if k in own and hasattr(v, "shape") and tuple(v.shape) != own[k])
    if shapes:
        shown = [f"{k} (checkpoint {list(weights[k].shape)}, model {list(own[k])})"
                 for k in shapes]
        raise CheckpointError(
            f"{checkpoint}: {len(shapes)} weights have another shape in "
            f"{type(model).__name__}: {listed_keys(shown)}. Nothing was loaded; build the model "
            f"with the checkpoint's sizes (model_config_kwargs) or leave those layers out.")
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    missing = sorted(k for k in missing if k not in tied)
    unexpected = sorted(unexpected)
    if not (missing or unexpected):
        return
    detail = (f"{len(missing)} of the model's keys not in the checkpoint (initial values "
              f"kept): {listed_keys(missing) or 'none'}; {len(unexpected)} of the checkpoint's "
              f"keys not in the model (not used): {listed_keys(unexpected) or 'none'}")
    if strict:
        raise CheckpointError(f"{checkpoint}: weights do not fit {type(model).__name__}: "
                              f"{detail}.")
    warnings.warn(f"{checkpoint}: loaded the weights that fit {type(model).__name__} (a new "
                  f"head on the pretrained body?): {detail}.", UserWarning, stacklevel=3)


def hf_from_checkpoint_path(checkpoint_path: str, model_instantiation_class: Any = None,
                            model_config_kwargs: Optional[dict[str, Any]] = None,
                            local_checkpoint_save_location: Optional[str] = None,
                            trust_remote_code: bool = False) -> tuple[Any, Any]:
    """:func:`hf_model_from_checkpoint` for a local path or an fsspec URL (downloaded; with
    ``local_checkpoint_save_location`` the download is kept there, else removed).
    ``HuggingFaceModel.hf_from_composer_checkpoint`` calls this."""
    import shutil

    from cadence.checkpoint.remote import fetched

    with fetched(checkpoint_path) as local:
        if local_checkpoint_save_location is not None and local != Path(
                local_checkpoint_save_location):
            keep = Path(local_checkpoint_save_location)
            keep.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if local.is_dir() else shutil.copyfile)(local, keep)
        return hf_model_from_checkpoint(local, model_instantiation_class, model_config_kwargs,
                                        trust_remote_code)
