"""The layout of a ``full`` checkpoint file: Composer's, both ways.

A ``full`` file holds Composer's top level, so ``torch.load(path, weights_only=True)
['state']['model']`` is the model's state dict, as for a file Composer writes::

    {"state": {"model": {...},                     # parameter name -> tensor
               "optimizers": {"AdamW": {...}},     # class name -> state keyed by parameter name
               "schedulers": {"LambdaLR": {...}},  # class name -> state dict
               "algorithms": [("EMA", {...})],     # (class name, state), in order of application
               "callbacks": {"CheckpointSaver": {...}},
               "timestamp": {"Timestamp": {...}},  # counters as ints, clocks as float seconds
               "rank_zero_seed": 17, "run_name": "...",
               "integrations": {"huggingface": {...}},   # a HuggingFaceModel's config
               "metadata": {...},                  # versions, world size, format, run config
               "data": [...],                      # cadence: the train loader's position, per rank
               "train_metrics": {...}, "eval_metrics": {...}},   # only with save_metrics
     "rng": [{"python": ..., "numpy": ..., "torch": ..., "cuda": ...}, ...]}  # one per rank

Unlike Composer, every value is a tensor or plain Python data (the Timestamp as its counters,
NumPy's RNG key as a tensor), so the file loads with ``weights_only=True``. A second instance
of a class is keyed ``Class#2`` (Composer would overwrite the first). A ``weights_only``
checkpoint holds ``state`` with ``model``, ``integrations``, ``metadata`` and ``timestamp``
only, and no ``rng``.

Inside cadence a checkpoint is handled as one flat dict (:func:`to_flat`): ``model``,
``optimizers`` (name -> state, in the run's order), ``schedulers`` (name -> state),
``algorithms`` / ``callbacks`` (name -> state), ``timestamp`` (a
:meth:`~cadence.core.time.Timestamp.state_dict`), ``rng`` (one entry per rank),
``metadata``, ``data``. :func:`to_flat` reads all three layouts a full file can have:
this one, the flat one cadence wrote before (top-level ``model``, ``metadata``...), and
Composer 0.32's own (its pickled objects read by
:func:`~cadence.checkpoint.safe_unpickle.composer_globals`, its RNG and timestamp mapped to
cadence's).

Source: Composer 0.32.1 ``State.state_dict`` and ``utils/checkpoint.py::_save_checkpoint``.
"""

from __future__ import annotations

import datetime
import fnmatch
import logging
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from cadence.checkpoint.errors import CheckpointError
from cadence.checkpoint.safe_unpickle import from_composer_objects
from cadence.core.time import Timestamp

__all__ = ["COMPOSER_MARK", "drop_paths", "first_value", "is_composer_written",
           "not_a_checkpoint", "to_file", "to_flat"]

#: Composer writes its version here (``state.metadata.composer_env_info``); cadence never does.
COMPOSER_MARK = "composer_env_info"

# Top-level keys of the flat layout that cadence wrote before this one (one is enough).
_LEGACY_KEYS = {"model", "metadata", "timestamp"}

log = logging.getLogger(__name__)


def _integrations(metadata: dict[str, Any]) -> dict[str, Any]:
    """Composer's ``integrations.huggingface`` from cadence's HF metadata (class, config,
    tokenizer), so a reader of Composer's layout finds the ``transformers`` config."""
    if "hf_class" not in metadata:
        return {}
    model = {"config": {"content": metadata.get("hf_config", {}), "class": metadata["hf_class"]}}
    hf: dict[str, Any] = {"model": model}
    if metadata.get("hf_tokenizer") is not None:
        hf["tokenizer"] = metadata["hf_tokenizer"]
    return {"huggingface": hf}


def to_file(flat: dict[str, Any]) -> dict[str, Any]:
    """The file layout (module docstring) of the flat checkpoint ``flat``."""
    state: dict[str, Any] = {}
    for key, value in flat.items():
        if key == "rng":
            continue
        if key == "algorithms" and isinstance(value, dict):
            value = [(name, sd) for name, sd in value.items()]
        elif key == "timestamp" and "Timestamp" not in value:
            value = {"Timestamp": value}
        state[key] = value
    metadata = flat.get("metadata") or {}
    state.setdefault("integrations", _integrations(metadata))
    for key in ("rank_zero_seed", "run_name"):
        if key in metadata:
            state.setdefault(key, metadata[key])
    out: dict[str, Any] = {"state": state}
    if "rng" in flat:
        out["rng"] = flat["rng"]
    return out


def is_composer_written(loaded: Any) -> bool:
    """Whether ``loaded`` (a full file's contents) was written by Composer itself."""
    state = loaded.get("state") if isinstance(loaded, dict) else None
    metadata = state.get("metadata") if isinstance(state, dict) else None
    return isinstance(metadata, dict) and COMPOSER_MARK in metadata


def _composer_rng(entry: dict[str, Any]) -> dict[str, Any]:
    """One rank of Composer's ``reproducibility.get_rng_state()`` as
    :func:`~cadence.utils.rng.get_rng_state` returns it."""
    version, internal, gauss = entry["python"]
    out: dict[str, Any] = {"python": [version, list(internal), gauss],
                           "torch": entry["torch"]}
    kind, keys, pos, has_gauss, cached = entry["numpy"]
    out["numpy"] = [kind, torch.from_numpy(np.asarray(keys).astype(np.int64)), int(pos),
                    int(has_gauss), float(cached)]
    cuda = entry.get("cuda")
    if cuda is not None:  # Composer saves the current device's state only
        out["cuda"] = [cuda] if isinstance(cuda, torch.Tensor) else list(cuda)
    return out


def _plain_data(obj: Any) -> Any:
    """``obj`` with str subclasses (torch's ``TorchVersion``) as ``str`` and timedeltas as
    seconds, so that, re-saved, it loads with ``weights_only=True``."""
    if isinstance(obj, str):
        return str(obj)
    if isinstance(obj, datetime.timedelta):
        return obj.total_seconds()
    if isinstance(obj, dict):
        return {k: _plain_data(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_plain_data(v) for v in obj)
    return obj


def _seconds(value: Any) -> Any:
    return value.total_seconds() if isinstance(value, datetime.timedelta) else value


def _timestamp(value: Any, path: Path) -> dict[str, Any]:
    """``{"Timestamp": {...}}`` (Composer's and this layout), a Timestamp object (from
    :func:`from_composer_objects`) or a bare dict (cadence's older layout) -> the dict."""
    if isinstance(value, Timestamp):
        return value.state_dict()
    if isinstance(value, dict) and "Timestamp" in value:
        value = value["Timestamp"]
        if isinstance(value, Timestamp):
            return value.state_dict()
    if not isinstance(value, dict) or "batch" not in value:
        raise CheckpointError(f"{path}: its timestamp is {type(value).__name__} {value!r:.80}, "
                              f"not the counters of a Timestamp.")
    return {k: _seconds(v) for k, v in value.items()}


def _from_composer(state: dict[str, Any], rng: Any, path: Path) -> dict[str, Any]:
    """Composer 0.32's ``state`` (+ top-level ``rng``) in the flat layout."""
    flat = {k: v for k, v in state.items() if k not in ("scaler", "dataset_state")}
    meta = _plain_data(dict(state.get("metadata") or {}))
    meta["composer_env"] = meta.pop(COMPOSER_MARK)  # re-saved, it is cadence's checkpoint
    version = meta["composer_env"].get("composer_version", "?")
    meta.setdefault("format", "full")
    meta.setdefault("world_size", len(rng) if isinstance(rng, list) and rng else 1)
    meta["composer_version"] = version
    for key in ("run_name", "rank_zero_seed"):
        if key in state:
            meta.setdefault(key, state[key])
    flat["metadata"] = meta
    if isinstance(rng, list):
        flat["rng"] = [_composer_rng(entry) for entry in rng]
    # e.g. CheckpointSaver's timestamps hold timedeltas: plain numbers, as cadence saves them
    flat["callbacks"] = _plain_data(dict(flat.get("callbacks") or {}))
    log.info("%s was written by Composer %s: loading its model, optimizer, schedulers, "
             "timestamp and RNG state.", path, version)
    return flat


def not_a_checkpoint(path: Path) -> str:
    """The message for a ``.pt`` that holds no checkpoint (e.g. plain weights)."""
    return (f"{path} is not a checkpoint: it holds no 'state' -> 'model' state dict (a .pt "
            f"file of plain weights? load it into the model yourself, e.g. "
            f"model.load_state_dict(torch.load(path, weights_only=True))).")


def to_flat(loaded: Any, path: Path) -> dict[str, Any]:
    """The flat layout (module docstring) of a full file's contents ``loaded``, whichever of
    the three layouts it has.

    Raises:
        CheckpointError: ``loaded`` is none of them (e.g. a ``.pt`` of plain weights),
            naming the file.
    """
    path = Path(path)
    if isinstance(loaded, dict) and isinstance(loaded.get("state"), dict):
        if is_composer_written(loaded):
            loaded = from_composer_objects(loaded)
            flat = _from_composer(loaded["state"], loaded.get("rng"), path)
        else:
            flat = dict(loaded["state"])
            if "rng" in loaded:
                flat["rng"] = loaded["rng"]
    elif isinstance(loaded, dict) and _LEGACY_KEYS & loaded.keys():
        flat = dict(loaded)  # cadence's layout before Composer's
    else:
        raise CheckpointError(not_a_checkpoint(path))
    if isinstance(flat.get("algorithms"), list):
        flat["algorithms"] = {name: sd for name, sd in flat["algorithms"]}
    if "timestamp" in flat:
        flat["timestamp"] = _timestamp(flat["timestamp"], path)
    flat.setdefault("metadata", {})
    return flat


def first_value(named: Optional[Any], index: int) -> Any:
    """The ``index``-th entry of ``named`` (a dict keyed by class name or index, or a list):
    optimizers and schedulers are matched to the run's by position."""
    values = list(named.values()) if isinstance(named, dict) else list(named or [])
    return values[index] if index < len(values) else None


def drop_paths(obj: dict[str, Any], ignore_keys: Any) -> dict[str, Any]:
    """Apply Composer's ``ignore_keys`` to ``obj`` (a checkpoint in the file layout) in place:
    a callable edits it; a list of glob patterns removes every entry whose ``/``-joined key
    path matches one (``state/model/*.bias``, ``state/optimizers``, ``rng``), with its
    subtree. A pattern that matches nothing is logged as a warning. ``state`` is kept.

    Raises:
        TypeError: ``ignore_keys`` is neither a callable nor a list of strings.
    """
    if callable(ignore_keys):
        ignore_keys(obj)
    else:
        if isinstance(ignore_keys, str) or not all(isinstance(p, str) for p in ignore_keys):
            raise TypeError(f"ignore_keys must be a list of glob patterns or a callable, got "
                            f"{ignore_keys!r}.")
        used: set[str] = set()
        _drop(obj, "", list(ignore_keys), used)
        for pattern in ignore_keys:
            if pattern not in used:
                log.warning("ignore_keys pattern %r matched nothing in the checkpoint.", pattern)
    obj.setdefault("state", {})
    return obj


def _drop(obj: dict[str, Any], prefix: str, patterns: list[str], used: set[str]) -> None:
    for key in list(obj):
        path = f"{prefix}{key}"
        hits = [p for p in patterns if fnmatch.fnmatchcase(path, p)]
        if hits:
            used.update(hits)
            del obj[key]
        elif isinstance(obj[key], dict):
            _drop(obj[key], path + "/", patterns, used)
