"""Adapter-only checkpoints: the trainable parameters, and the frozen base they need.

A model whose ``saves_adapters_only`` is true (a :class:`~cadence.models.HuggingFaceModel`
with ``peft_config`` and ``should_save_peft_only``) is saved without its frozen parameters
(``StateDictOptions(ignore_frozen_params=True)``): the adapters, their optimizer state and
everything resume needs. The metadata's ``adapter_only`` entry names the frozen base (name
or path, and a CRC32C of its weights: the model's ``peft_base``); loading such a checkpoint
checks the adapter set strictly and refuses a model whose base differs, naming both.

Duck-typed on the model: nothing here imports ``cadence.models``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from torch import nn

__all__ = ["METADATA_KEY", "adapter_metadata", "base_difference", "base_mismatch",
           "model_state_dict", "saves_adapters_only"]

METADATA_KEY = "adapter_only"
"""The checkpoint metadata key: ``{"base": {"name_or_path", "crc32c", "over"}, "adapter":
peft config}``."""


def _inner(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model) if type(model).__name__ == \
        "DistributedDataParallel" else model


def saves_adapters_only(model: nn.Module) -> bool:
    """Whether ``model``'s checkpoints leave its frozen parameters out."""
    return bool(getattr(_inner(model), "saves_adapters_only", False))


def model_state_dict(model: nn.Module, options: Any) -> dict[str, Any]:
    """``get_model_state_dict(model, options=options)``; with ``ignore_frozen_params`` also
    without the frozen parameters' *aliases*.

    torch drops frozen parameters by walking ``named_parameters()``, which names a tied
    parameter once, so its other name stays: a GPT-2's ``lm_head.weight`` (tied to
    ``transformer.wte.weight``) was 3.1 of an adapter-only checkpoint's 3.9 MB. Every name of
    a frozen parameter is dropped here, mapped to its state-dict key as torch maps it.

    Args:
        model: the (possibly DDP-, FSDP2- or ``torch.compile``-wrapped) model.
        options: a ``torch.distributed.checkpoint.state_dict.StateDictOptions``.

    Returns:
        The model state dict (DTensors for a sharded model unless ``full_state_dict``).
    """
    from torch.distributed.checkpoint.state_dict import _get_fqns, get_model_state_dict

    state_dict = get_model_state_dict(model, options=options)
    if options.ignore_frozen_params:
        for name, param in model.named_parameters(remove_duplicate=False):
            if not param.requires_grad:
                for key in _get_fqns(model, name):
                    state_dict.pop(key, None)
    return state_dict


#: peft config fields that may differ on a true resume (where the base was read from).
_ADAPTER_KEYS_NOT_COMPARED = frozenset({"base_model_name_or_path", "revision",
                                        "inference_mode"})


def _adapter_config(model: nn.Module) -> Optional[dict[str, Any]]:
    """The model's one ``peft`` adapter config as JSON data, or None."""
    from cadence.checkpoint.peft_metadata import PEFT_METADATA_KEY, peft_metadata

    inner = getattr(_inner(model), "model", None)
    if inner is None:
        return None
    try:
        recorded = peft_metadata(inner)
    except ValueError:  # several adapters: nothing single to compare
        return None
    return dict(recorded[PEFT_METADATA_KEY]["config"]) if recorded else None


def adapter_metadata(model: nn.Module) -> dict[str, Any]:
    """``{"adapter_only": {"base": ..., "adapter": peft config}}`` for the checkpoint
    metadata, or ``{}``."""
    if not saves_adapters_only(model):
        return {}
    entry: dict[str, Any] = {"base": dict(getattr(_inner(model), "peft_base", None) or {})}
    config = _adapter_config(model)
    if config is not None:
        entry["adapter"] = config
    return {METADATA_KEY: entry}


def _adapter_mismatch(path: Path, saved: Optional[dict[str, Any]],
                      model: nn.Module) -> Optional[str]:
    """The first peft config field that differs between the checkpoint and the model."""
    mine = _adapter_config(model)
    if not saved or mine is None:
        return None
    for key in sorted(set(saved) | set(mine)):
        if key in _ADAPTER_KEYS_NOT_COMPARED or saved.get(key) == mine.get(key):
            continue
        return (f"{path} holds adapters trained with {key}={saved.get(key)!r}, but this run's "
                f"peft config has {key}={mine.get(key)!r}: the adapters would be applied "
                f"differently. Resume with the checkpoint's peft config, or start a new run.")
    return None


def _describe(base: dict[str, Any]) -> str:
    crc = base.get("crc32c")
    what = f"CRC32C {crc} of its {base.get('over', 'weights')}" if crc else "no checksum"
    return f"{base.get('name_or_path') or '(unnamed)'} ({what})"


def base_mismatch(path: Path, metadata: dict[str, Any], model: nn.Module) -> Optional[str]:
    """Why the adapter-only checkpoint at ``path`` cannot load into ``model``, or None (also
    for a checkpoint that is not adapter-only).

    Refused: a model that does not train adapters, a peft config that differs from the
    recorded one (the first such key and both values), and a base whose CRC32C differs from
    the recorded one (both named). A base without a checksum (built on the meta device) is
    compared by name only.
    """
    saved = metadata.get(METADATA_KEY)
    if not saved:
        return None
    base = dict(saved.get("base") or {})
    if not saves_adapters_only(model):
        return (f"{path} is an adapter-only checkpoint (frozen base {_describe(base)}), but this "
                f"run's model saves all its weights: build it with the same peft_config and "
                f"should_save_peft_only=True, on that base.")
    adapter = _adapter_mismatch(path, saved.get("adapter"), model)
    if adapter is not None:
        return adapter
    mine = dict(getattr(_inner(model), "peft_base", None) or {})
    difference = base_difference(base, mine)
    if difference is None:
        return None
    return (f"{path} holds adapters trained on the base {_describe(base)}, but this run's base "
            f"is {_describe(mine)}{difference}: the adapters would be applied to other "
            f"weights. Resume on the checkpoint's base (pretrained_model_name_or_path), or "
            f"start a new run.")


def base_difference(saved: dict[str, Any], mine: dict[str, Any]) -> Optional[str]:
    """How the base ``mine`` differs from the recorded ``saved`` (``", tensor X differs"``,
    ``", config.json's K is A, not B"``, or ``""`` when only the checksums say so), or None
    when they are the same base. Identities without a checksum (built on the meta device),
    or with the older checksum of the raw weight files, compare by name only."""
    legacy = saved.get("over") == "weight files"  # an older checksum of the raw files
    if legacy or not (saved.get("crc32c") and mine.get("crc32c")):
        return None if saved.get("name_or_path") == mine.get("name_or_path") else ""
    if saved.get("crc32c") == mine.get("crc32c") and saved.get("over") == mine.get("over"):
        return None
    before, now = saved.get("tensors"), mine.get("tensors")
    if isinstance(before, dict) and isinstance(now, dict):
        for name in sorted(set(before) | set(now)):
            if before.get(name) != now.get(name):
                what = ("is missing" if name not in now else "is new" if name not in before
                        else "has other values")
                return f", tensor {name!r} {what}"
    before, now = saved.get("config"), mine.get("config")
    if isinstance(before, dict) and isinstance(now, dict):
        for key in sorted(set(before) | set(now)):
            if before.get(key) != now.get(key):
                return f", config.json's {key!r} is {now.get(key)!r} (was {before.get(key)!r})"
    return ""
