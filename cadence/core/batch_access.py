"""Reading and writing one part of a batch by key: the implementation behind Composer's
``batch_get`` / ``batch_set`` (:mod:`cadence.utils.batch_helpers`, their public home) and
``State.batch_get_item`` / ``State.batch_set_item``. It lives in ``core`` so that
:class:`~cadence.core.state.State` can use it (``core`` imports nothing else from cadence).

A ``key`` is one of:

- an index or mapping key (``0``, ``"input_ids"``), or an attribute name (``"x"`` of a
  dataclass or named tuple);
- a sequence of such keys (``[0, 1]``): their values together;
- a callable: ``getter(batch) -> value`` for :func:`get_item`,
  ``setter(batch, value) -> batch`` for :func:`set_item`;
- a pair ``(getter, setter)`` of callables: each function uses its half.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter, itemgetter
from typing import Any, Callable, Union

__all__ = ["BatchKey", "get_item", "set_item"]

BatchKey = Union[int, str, Sequence[Any], Callable[..., Any], tuple[Callable[..., Any], Callable[..., Any]]]


def _getter_setter_pair(key: Any) -> bool:
    """Whether ``key`` is a ``(getter, setter)`` pair.

    Raises:
        ValueError: a sequence of callables whose length is not 2.
    """
    if isinstance(key, str) or not isinstance(key, Sequence) or not key:
        return False
    if not all(callable(part) for part in key):
        return False
    if len(key) != 2:
        raise ValueError(f"A key made of callables must be a (getter, setter) pair; got "
                         f"{len(key)} callables.")
    return True


def get_item(batch: Any, key: BatchKey) -> Any:
    """The part of ``batch`` that ``key`` names (see the module docstring for keys).

    Example::

        get_item({"x": x, "y": y}, "y")                 # y
        get_item((x, y), 0)                             # x
        get_item((x, y), [0, 1])                        # (x, y)
        get_item(batch, lambda b: b["x"][:, :8])        # a getter

    Raises:
        KeyError, IndexError, AttributeError: ``key`` names nothing in ``batch``.
    """
    if _getter_setter_pair(key):
        return key[0](batch)
    if callable(key):
        return key(batch)
    try:
        return itemgetter(key)(batch)
    except (IndexError, TypeError):
        pass
    if isinstance(key, Sequence) and not isinstance(key, str):
        try:
            return itemgetter(*key)(batch)
        except TypeError:
            return attrgetter(*key)(batch)
    return attrgetter(key)(batch)


def _set_in_tuple(batch: tuple[Any, ...], key: Union[int, str], value: Any) -> tuple[Any, ...]:
    """A new tuple (or named tuple) with ``key`` replaced: tuples cannot be changed in place."""
    if hasattr(batch, "_fields"):  # a named tuple
        if isinstance(key, str):
            return batch._replace(**{key: value})  # type: ignore[attr-defined]
        items = list(batch)
        items[key] = value
        return batch._make(items)  # type: ignore[attr-defined]
    items = list(batch)
    items[key] = value  # type: ignore[index]
    return tuple(items)


def _set_one(batch: Any, key: Any, value: Any) -> Any:
    if isinstance(batch, tuple):
        return _set_in_tuple(batch, key, value)
    try:
        batch[key]  # only existing keys: a dict would grow a new key otherwise
    except TypeError as error:  # not subscriptable: try an attribute
        if "not subscriptable" not in str(error) and "indices must be" not in str(error):
            raise
    else:
        batch[key] = value
        return batch
    if not hasattr(batch, key):
        raise RuntimeError(f"Cannot set {key!r} on a batch of type {type(batch).__name__}: it "
                           f"has no such item or attribute; pass a setter function instead.")
    setattr(batch, key, value)
    return batch


def set_item(batch: Any, key: BatchKey, value: Any) -> Any:
    """``batch`` with the part that ``key`` names set to ``value``.

    Lists, dicts, tensors and objects are changed in place (and returned); tuples and named
    tuples cannot be, so a new one is returned: always use the return value.

    Example::

        batch = set_item(batch, "input_ids", truncated)         # [batch, seq'] tensor
        batch = set_item((x, y), 1, smoothed)                   # a new tuple

    Raises:
        KeyError, IndexError: ``key`` is not already in ``batch`` (a mapping does not grow).
        RuntimeError: ``batch`` has neither such an item nor such an attribute.
        ValueError: a sequence of keys with a value of another length.
    """
    if _getter_setter_pair(key):
        return key[1](batch, value)
    if callable(key):
        return key(batch, value)
    if isinstance(key, Sequence) and not isinstance(key, str):
        try:
            batch[key]  # tensors and arrays take a sequence of indices
            batch[key] = value
            return batch
        except (IndexError, TypeError, KeyError):
            pass
        if isinstance(value, str) or not hasattr(value, "__len__") or len(value) != len(key):
            raise ValueError(f"Setting {len(key)} keys needs a sequence of {len(key)} values; "
                             f"got {type(value).__name__}.")
        for one_key, one_value in zip(key, value):
            batch = _set_one(batch, one_key, one_value)
        return batch
    return _set_one(batch, key, value)
