"""Reading and writing one part of a batch by key: the implementation behind Composer's
``batch_get`` / ``batch_set`` (:mod:`cadence.utils.batch_helpers`: their public home, where
the keys, examples and errors are documented) and ``State.batch_get_item`` /
``State.batch_set_item``. It lives in ``core`` so that :class:`~cadence.core.state.State` can
use it (``core`` imports nothing else from cadence).
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


def _array_index(batch: Any, key: Any) -> Any:
    """A list of slices (``[slice(2, 4), slice(1, 3)]``) into a tensor or array as the tuple
    it means (``batch[2:4, 1:3]``, Composer's semantics): torch and numpy deprecate indexing
    with a list that holds slices. Any other key is returned as it is."""
    if (isinstance(key, list) and hasattr(batch, "shape")
            and any(isinstance(k, slice) or k is Ellipsis or k is None for k in key)):
        return tuple(key)
    return key


def get_item(batch: Any, key: BatchKey) -> Any:
    """Composer's ``batch_get``: see :func:`cadence.utils.batch_helpers.batch_get`."""
    key = _array_index(batch, key)
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
    """Composer's ``batch_set``: see :func:`cadence.utils.batch_helpers.batch_set`."""
    key = _array_index(batch, key)
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
