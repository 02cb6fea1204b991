"""Parameter-efficient fine-tuning through ``peft``: adapters on a frozen base model.

:class:`~cadence.models.HuggingFaceModel` takes ``peft_config`` (a ``peft.PeftConfig``, or
from a run file a mapping such as ``{peft_type: LORA, r: 8, lora_alpha: 16, target_modules:
[q_proj, v_proj]}``) and wraps its model with ``peft.get_peft_model``: the base weights are
frozen (``requires_grad=False``) and only the adapters train. LoRA (Hu et al. 2021, "LoRA:
Low-Rank Adaptation of Large Language Models"; DoRA is LoRA with ``use_dora: true``) and
IA3 are supported: their adapters are plain modules, which FSDP2 shards like any other.

With ``should_save_peft_only`` (default, as in Composer) checkpoints hold only the trainable
parameters (:mod:`cadence.checkpoint.checkpoint`); the frozen base is read again from where
it came from, and :func:`base_identity` records what it was (name or path, and a CRC32C of
its weights) so that a resume onto different base weights is refused.

Needs the ``peft`` package: ``pip install 'cadence[peft]'``.

Source: Composer ``composer/models/huggingface.py`` (``peft_config``,
``should_save_peft_only``); ``peft``'s ``LoraConfig`` and ``get_peft_model``.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import warnings
from collections.abc import Mapping
from typing import Any, Optional

import torch
from torch import nn

__all__ = ["SUPPORTED_PEFT_TYPES", "base_identity", "check_peft_arg", "folder_identity", "import_peft",
           "peft_config_class", "peft_config_from_dict", "wrap_with_peft"]

SUPPORTED_PEFT_TYPES = ("LORA", "IA3")
"""``peft_type`` values whose adapters are plain modules (DoRA: ``LORA`` with ``use_dora``)."""

_INSTALL = "pip install 'cadence[peft]'"


def import_peft() -> Any:
    """The ``peft`` module.

    Raises:
        ImportError: ``peft`` is not installed; the message names the ``peft`` extra.
    """
    try:
        import peft
    except ImportError as exc:
        raise ImportError(f"peft_config needs the peft package, which is not installed: "
                          f"{_INSTALL} (or pip install 'peft>=0.13').") from exc
    return peft


def peft_config_class(peft_type: str) -> type:
    """``peft``'s config class for ``peft_type`` (``"LORA"`` -> ``peft.LoraConfig``).

    Raises:
        ImportError: ``peft`` is not installed (naming the extra).
        KeyError: ``peft`` has no such type.
    """
    import importlib

    import_peft()
    return importlib.import_module("peft.mapping").PEFT_TYPE_TO_CONFIG_MAPPING[peft_type]


def peft_config_from_dict(spec: Mapping[str, Any], where: str = "peft",
                          task_type: str = "CAUSAL_LM") -> Any:
    """A ``peft.PeftConfig`` from a run file's mapping.

    Args:
        spec: ``peft_type`` (``LORA`` or ``IA3``) and that config class's fields (for LoRA:
            ``r``, ``lora_alpha``, ``target_modules``, ``lora_dropout``, ``use_dora``, ...).
        where: the key path, for messages.
        task_type: ``spec``'s ``task_type`` when it has none (default ``CAUSAL_LM``; a
            classifier's is ``SEQ_CLS``, under which ``peft`` also trains the new head).

    Raises:
        ValueError: no or unknown ``peft_type``, an unknown key (named, with the nearest
            field), or a value the config class refuses.
        ImportError: ``peft`` is not installed.
    """
    if not isinstance(spec, Mapping):
        raise ValueError(f"{where} must be a mapping such as {{peft_type: LORA, r: 8, "
                         f"target_modules: [q_proj, v_proj]}}, got {type(spec).__name__}.")
    import_peft()  # the ImportError naming the extra comes first
    kwargs = dict(spec)
    peft_type = str(kwargs.pop("peft_type", "")).upper()
    if peft_type not in SUPPORTED_PEFT_TYPES:
        raise ValueError(f"{where}.peft_type={spec.get('peft_type')!r} is not supported; "
                         f"allowed: {', '.join(SUPPORTED_PEFT_TYPES)} (DoRA: LORA with "
                         f"use_dora: true).")
    config_class = peft_config_class(peft_type)
    fields = {f.name for f in dataclasses.fields(config_class) if f.init}
    for key in kwargs:
        if key not in fields:
            near = difflib.get_close_matches(key, sorted(fields), n=1)
            hint = f" Did you mean {near[0]!r}?" if near else ""
            raise ValueError(f"{where}.{key} is not a {config_class.__name__} field.{hint} "
                             f"Fields: {', '.join(sorted(fields - {'peft_type'}))}.")
    kwargs.setdefault("task_type", task_type)
    if isinstance(kwargs.get("target_modules"), (list, tuple)):
        kwargs["target_modules"] = list(kwargs["target_modules"])
    try:
        return config_class(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {config_class.__name__} refused {dict(spec)}: {exc}") from None


def check_peft_arg(value: Any) -> bool:
    """Value-stage check of ``hf_pretrained``'s ``peft`` argument (``None`` or a mapping
    :func:`peft_config_from_dict` accepts); raises its ``ValueError`` naming the key."""
    if value is None:
        return True
    peft_config_from_dict(value)
    return True


def wrap_with_peft(model: nn.Module, peft_config: Any) -> nn.Module:
    """``model`` wrapped by ``peft.get_peft_model(model, peft_config)`` (base frozen).

    A model that already is a ``peft.PeftModel`` is returned as is (as Composer does).

    Raises:
        ImportError: ``peft`` is not installed.
        TypeError: ``peft_config`` is not a ``peft.PeftConfig`` (nor a mapping).
        ValueError: its ``peft_type`` is not one of :data:`SUPPORTED_PEFT_TYPES`.
    """
    peft = import_peft()
    if isinstance(peft_config, Mapping):
        peft_config = peft_config_from_dict(peft_config, "peft_config")
    if not isinstance(peft_config, peft.PeftConfig):
        raise TypeError(f"peft_config must be a peft.PeftConfig (e.g. peft.LoraConfig(r=8, "
                        f"target_modules=[...])) or a mapping, got {type(peft_config).__name__}.")
    peft_type = str(getattr(peft_config.peft_type, "value", peft_config.peft_type))
    if peft_type not in SUPPORTED_PEFT_TYPES:
        raise ValueError(f"peft_config: peft_type {peft_type} is not supported; allowed: "
                         f"{', '.join(SUPPORTED_PEFT_TYPES)} (their adapters are plain modules "
                         f"that FSDP2 shards; prompt-learning methods add virtual tokens).")
    if isinstance(model, peft.PeftModel):
        return model
    with warnings.catch_warnings():
        # peft reads transformers' deprecated ``is_gradient_checkpointing`` while wrapping;
        # nothing a caller can change (peft 0.21, transformers 5)
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated",
                                category=FutureWarning)
        return peft.get_peft_model(model, peft_config)


def _crc_tensor(crc: int, name: str, tensor: torch.Tensor) -> int:
    import crc32c

    crc = crc32c.crc32c(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode(), crc)
    data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    return crc32c.crc32c(memoryview(data), crc)


#: config.json fields that say nothing about the weights (where and by what they were saved).
_CONFIG_KEYS_NOT_COMPARED = frozenset({"_name_or_path", "transformers_version"})


def folder_identity(folder: str) -> dict[str, Any]:
    """What a ``save_pretrained`` folder's loader reads: each tensor's CRC32C (over its name,
    dtype, shape and bytes, from the file its index names), ``config.json``'s fields, and
    one CRC32C over both. Re-sharding the same weights, or a stray ``*.safetensors`` file
    beside them, keeps it; another tensor or config value changes it.

    Returns:
        ``{"crc32c", "over": "tensors and config", "tensors": {name: crc}, "config": {...}}``.

    Raises:
        cadence.parallel.hf_weights.WeightFileError: a weight file outside the folder or
            damaged.
    """
    import crc32c

    from cadence.parallel.hf_weights import find_checkpoint_files, safe_open

    files = find_checkpoint_files(folder)
    tensors: dict[str, str] = {}
    if files.format == "safetensors":
        for name in files.files:
            with safe_open(files.path(name)) as handle:
                keys = [k for k in handle.keys()
                        if files.weight_map is None or files.weight_map.get(k) == name]
                for key in keys:
                    tensors[key] = f"{_crc_tensor(0, key, handle.get_tensor(key)):08x}"
    else:
        from cadence.checkpoint.checkpoint import safe_torch_load

        for name in files.files:
            state = safe_torch_load(files.path(name), mmap=True)
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and (
                        files.weight_map is None or files.weight_map.get(key) == name):
                    tensors[key] = f"{_crc_tensor(0, key, value):08x}"
    config: dict[str, Any] = {}
    config_path = os.path.join(folder, "config.json")
    if os.path.isfile(config_path):
        with open(config_path, encoding="utf-8") as f:
            config = {k: v for k, v in json.load(f).items() if k not in _CONFIG_KEYS_NOT_COMPARED}
    crc = 0
    for key in sorted(tensors):
        crc = crc32c.crc32c(f"{key}={tensors[key]};".encode(), crc)
    crc = crc32c.crc32c(json.dumps(config, sort_keys=True).encode(), crc)
    return {"crc32c": f"{crc:08x}", "over": "tensors and config", "tensors": tensors,
            "config": config}


def base_identity(model: nn.Module, name_or_path: Optional[str] = None) -> dict[str, Any]:
    """What the frozen base of an adapter-only checkpoint is: ``{"name_or_path", "crc32c",
    "over"}``. Called on the ``transformers`` model before ``peft`` wraps it.

    When ``name_or_path`` is a ``save_pretrained`` directory: :func:`folder_identity`, what
    its loader reads (each tensor, by name, and ``config.json``; ``over: "tensors and
    config"``). Else a CRC32C over the model's parameters and persistent buffers, by name
    (``over: "weights"``); ``None`` when the weights are still on the meta device.

    Args:
        model: the base ``transformers`` model.
        name_or_path: where it came from; default its ``name_or_path`` (``config._name_or_path``).
    """
    if name_or_path is None:
        name_or_path = str(getattr(model, "name_or_path", "") or "")
    name = name_or_path or f"(built from a config: {type(model).__name__})"
    if name_or_path and os.path.isdir(name_or_path):
        from cadence.parallel.hf_weights import find_checkpoint_files

        try:
            find_checkpoint_files(name_or_path)
        except FileNotFoundError:
            pass
        else:
            return {"name_or_path": name, **folder_identity(name_or_path)}
    state = model.state_dict()
    if any(t.is_meta for t in state.values() if isinstance(t, torch.Tensor)):
        return {"name_or_path": name, "crc32c": None, "over": "weights"}
    crc = 0
    for key in sorted(state):
        if isinstance(state[key], torch.Tensor):
            crc = _crc_tensor(crc, key, state[key])
    return {"name_or_path": name, "crc32c": f"{crc:08x}", "over": "weights"}
