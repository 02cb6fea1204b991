"""The tensor-parallel style names a ``layer_plan`` may use, and the one resolver from a
name or a dotted path to a style.

``parallelism_config.tp.layer_plan`` maps module patterns to styles (see
:mod:`cadence.parallel.tp`). A style is written as one of :data:`TP_STYLE_NAMES`, one of
torch's class names in :data:`TP_STYLE_ALIASES`, a dotted path to a ``ParallelStyle``
class, or (from Python) a ``ParallelStyle`` object. The run-file check
(:mod:`cadence.parallel.config`) and the tensor-parallel step (:mod:`cadence.parallel.tp`)
both read styles through :func:`resolve_tp_style`, so the two agree on what a name means.

This module imports no torch at import time: the run file's torch-free first stage checks
names and aliases here; only a dotted path is imported (with torch) when resolved.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Optional, Union

from cadence.registry.errors import did_you_mean

__all__ = ["TP_STYLE_NAMES", "TP_STYLE_ALIASES", "unknown_tp_style", "resolve_tp_style",
           "tp_style_problem"]

#: The tensor-parallel style names a ``layer_plan`` may use (:mod:`cadence.parallel.tp`).
TP_STYLE_NAMES = ("colwise", "rowwise", "sequence_parallel", "fused_qkv_colwise", "replicate")
#: torch's class names for those styles, accepted as aliases.
TP_STYLE_ALIASES = {"ColwiseParallel": "colwise", "RowwiseParallel": "rowwise",
                    "SequenceParallel": "sequence_parallel",
                    "FusedQKVColwiseParallel": "fused_qkv_colwise",
                    "ReplicateParallel": "replicate"}


def unknown_tp_style(text: str) -> str:
    """The message for a style string that is neither a name, an alias nor a dotted path.

    Args:
        text: the style as written.

    Returns:
        The message, with a "did you mean" and the allowed styles.
    """
    hint = did_you_mean(text, [*TP_STYLE_NAMES, *TP_STYLE_ALIASES])
    return (f"{text!r} is not a style.{hint} Allowed: {', '.join(TP_STYLE_NAMES)}, a "
            f"ParallelStyle, or a dotted path to a ParallelStyle class.")


def resolve_tp_style(text: str) -> Union[str, type]:
    """What a style string means: a name of :data:`TP_STYLE_NAMES` (aliases mapped to it),
    or the ``ParallelStyle`` subclass a dotted path names (imported here, with torch).

    Args:
        text: a style name, one of torch's class names, or ``package.module.StyleClass``.

    Returns:
        The canonical style name, or the ``ParallelStyle`` class.

    Raises:
        ValueError: the path cannot be imported, names no ``ParallelStyle`` class, or the
            text is no style at all (the message has a "did you mean").
    """
    key = TP_STYLE_ALIASES.get(text, text)
    if key in TP_STYLE_NAMES:
        return key
    if "." not in text:
        raise ValueError(unknown_tp_style(text))
    module_name, _, attr = text.rpartition(".")
    try:
        target = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot import {text!r} ({exc}).") from None
    from torch.distributed.tensor.parallel import ParallelStyle

    if isinstance(target, type) and issubclass(target, ParallelStyle):
        return target
    raise ValueError(f"{text!r} is not a ParallelStyle class.")


def tp_style_problem(style: Any, import_paths: bool = True) -> Optional[str]:
    """Why ``style`` is not a usable style, or None (checked before any process starts).

    Names and aliases are checked without torch. A ``ParallelStyle`` object can only exist
    once torch's tensor-parallel module is loaded, so it is recognised through
    ``sys.modules`` without importing torch.

    Args:
        style: a ``layer_plan`` value.
        import_paths: import a dotted path to check it (the run file's second stage);
            false leaves it unchecked (the torch-free first stage).

    Returns:
        The problem's message, or None.
    """
    parallel = sys.modules.get("torch.distributed.tensor.parallel")
    if parallel is not None and isinstance(style, parallel.ParallelStyle):
        return None
    if not isinstance(style, str):
        return f"{style!r} ({type(style).__name__}) is not a style name or a ParallelStyle."
    if TP_STYLE_ALIASES.get(style, style) in TP_STYLE_NAMES:
        return None
    if "." not in style:
        return unknown_tp_style(style)
    if not import_paths:
        return None
    try:
        resolve_tp_style(style)
    except ValueError as exc:
        return str(exc)
    return None
