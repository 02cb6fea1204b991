"""Strict loads: whether a checkpoint's model fits the run's model, checked before any tensor
is loaded (and so before any training).

``load_strict_model_weights`` (default true) means strict: every parameter and buffer of the
run's model must be in the checkpoint and every one in the checkpoint must be in the model
(keys skipped by ``load_ignore_keys`` aside), each with the same shape. A shape mismatch is
refused even when not strict (no tensor of the wrong shape can be loaded); skip such a key
with ``load_ignore_keys: ['model/<name>']``. The error lists up to ten keys of each kind and
says how to load what fits.

PyTorch's own check cannot be relied on here: ``set_model_state_dict`` with a full state dict
leaves keys missing from the checkpoint at their initial values without a word.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

__all__ = ["MAX_LISTED", "listed_keys", "model_mismatch", "shapes_of"]

#: How many keys of each kind (missing, unexpected, mismatched) an error lists.
MAX_LISTED = 10


def shapes_of(state_dict: Mapping[str, Any]) -> dict[str, Optional[tuple[int, ...]]]:
    """Key -> shape (a DTensor's global shape) of a model state dict; None for a value that
    is not a tensor."""
    return {key: tuple(value.shape) if hasattr(value, "shape") else None
            for key, value in state_dict.items()}


def listed_keys(keys: Sequence[str]) -> str:
    """The first :data:`MAX_LISTED` of ``keys``, comma-separated, then "and N more"."""
    shown = ", ".join(keys[:MAX_LISTED])
    more = f" and {len(keys) - MAX_LISTED} more" if len(keys) > MAX_LISTED else ""
    return f"{shown}{more}"


def model_mismatch(path: Path, checkpoint: Mapping[str, Optional[tuple[int, ...]]],
                   model: Mapping[str, Optional[tuple[int, ...]]], strict: bool,
                   ignore_keys: Sequence[str] = ()) -> Optional[str]:
    """Why the model in the checkpoint at ``path`` does not fit the run's model, or None.

    Args:
        path: the checkpoint (for the message).
        checkpoint: its model's key -> shape.
        model: the run's model's key -> shape.
        strict: missing and unexpected keys count (``load_strict_model_weights``); shape
            mismatches always do.
        ignore_keys: ``load_ignore_keys`` patterns; ``model/<key>`` matches skip that key.

    Returns:
        The error message (naming up to :data:`MAX_LISTED` keys of each kind and the fix),
        or None when the checkpoint fits.
    """
    def kept(key: str) -> bool:
        return not any(fnmatch.fnmatchcase(f"model/{key}", pat) for pat in ignore_keys)

    saved = {k: v for k, v in checkpoint.items() if kept(k)}
    wanted = {k: v for k, v in model.items() if kept(k)}
    missing = sorted(k for k in wanted if k not in saved) if strict else []
    unexpected = sorted(k for k in saved if k not in wanted) if strict else []
    shapes = sorted(k for k in wanted if k in saved and saved[k] is not None
                    and wanted[k] is not None and saved[k] != wanted[k])
    if not (missing or unexpected or shapes):
        return None
    parts = []
    if missing:
        parts.append(f"{len(missing)} in the model but not in the checkpoint: "
                     f"{listed_keys(missing)}")
    if unexpected:
        parts.append(f"{len(unexpected)} in the checkpoint but not in the model: "
                     f"{listed_keys(unexpected)}")
    if shapes:
        shown = [f"{k} (checkpoint {list(saved[k] or ())}, model {list(wanted[k] or ())})"
                 for k in shapes]
        parts.append(f"{len(shapes)} with another shape: {listed_keys(shown)}")
    how = ("To load only what fits, set load_strict_model_weights: false (the model's keys "
           "missing from the checkpoint keep their initial values), and/or skip keys with "
           "load_ignore_keys: ['model/<name>'] (glob patterns; needed for a shape mismatch)."
           if strict else
           "Skip the mismatched keys with load_ignore_keys: ['model/<name>'] (glob patterns): "
           "they keep their initial values.")
    mode = ("load_strict_model_weights is true" if strict else "not strict, but a tensor of "
            "another shape cannot be loaded")
    return (f"The model in {path} does not fit this run's model ({mode}): "
            f"{'; '.join(parts)}. Nothing was loaded. {how}")
