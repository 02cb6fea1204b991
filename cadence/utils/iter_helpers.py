"""Composer's ``composer.utils.iter_helpers``: :func:`ensure_tuple`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["ensure_tuple"]


def ensure_tuple(x: Any) -> tuple[Any, ...]:
    """``x`` as a tuple, as Composer's ``ensure_tuple``: ``None`` -> ``()``; a ``str``,
    ``bytes`` or ``bytearray`` -> ``(x,)``; a tuple as it is; another sequence (a list) ->
    its items; a mapping -> its values; anything else -> ``(x,)``. Never raises."""
    if x is None:
        return ()
    if isinstance(x, (str, bytes, bytearray)):
        return (x,)
    if isinstance(x, tuple):
        return x
    if isinstance(x, Sequence):
        return tuple(x)
    if isinstance(x, Mapping):
        return tuple(x.values())
    return (x,)
