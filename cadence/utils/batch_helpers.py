"""Read and write one part of a batch, whatever its structure.

Source: MosaicML Composer's ``batch_get`` / ``batch_set`` (``composer/utils/batch_helpers.py``):
same keys and semantics, so an algorithm's ``input_key``/``target_key`` work the same way.
The implementation is :mod:`cadence.core.batch_access` (shared with
``State.batch_get_item`` / ``State.batch_set_item``).

A ``key`` is one of:

- an index or mapping key (``0``, ``"input_ids"``), or an attribute name (``"x"`` of a
  dataclass or named tuple);
- a sequence of such keys (``[0, 1]``): their values together;
- a callable: ``getter(batch) -> value`` for :func:`batch_get`,
  ``setter(batch, value) -> batch`` for :func:`batch_set`;
- a pair ``(getter, setter)`` of callables: each function uses its half.
"""

from __future__ import annotations

from typing import Any

from cadence.core.batch_access import BatchKey, get_item, set_item

__all__ = ["batch_get", "batch_set"]


def batch_get(batch: Any, key: BatchKey) -> Any:
    """The part of ``batch`` that ``key`` names (see the module docstring for keys).

    Example::

        batch_get({"x": x, "y": y}, "y")                 # y
        batch_get((x, y), 0)                             # x
        batch_get((x, y), [0, 1])                        # (x, y)
        batch_get(batch, lambda b: b["x"][:, :8])        # a getter

    Raises:
        KeyError, IndexError, AttributeError: ``key`` names nothing in ``batch``.
        ValueError: a key of callables that is not a ``(getter, setter)`` pair.
    """
    return get_item(batch, key)


def batch_set(batch: Any, key: BatchKey, value: Any) -> Any:
    """``batch`` with the part that ``key`` names set to ``value``.

    Lists, dicts, tensors and objects are changed in place (and returned); tuples and named
    tuples cannot be, so a new one is returned: always use the return value.

    Example::

        batch = batch_set(batch, "input_ids", truncated)         # [batch, seq'] tensor
        batch = batch_set((x, y), 1, smoothed)                   # a new tuple

    Raises:
        KeyError, IndexError: ``key`` is not already in ``batch`` (a mapping does not grow).
        RuntimeError: ``batch`` has neither such an item nor such an attribute.
        ValueError: a sequence of keys with a value of another length.
    """
    return set_item(batch, key, value)
