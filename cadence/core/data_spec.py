"""Batch helpers: move a batch to a device, count its samples, split it into microbatches.

A batch is a tensor, a mapping of tensors (and other values: a ``dict``, a Hugging Face
``BatchEncoding`` from a tokenizer, any ``collections.abc.Mapping``), or a ``list``/``tuple``
(named tuples too) of tensors, nested, with the sample dimension first (``[batch, ...]``).
A mapping comes back as its own type when that type can be built from a dict (a
``BatchEncoding`` stays a ``BatchEncoding``), else as a ``dict``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["batch_to_device", "num_samples", "slice_batch", "split_batch"]


def _rebuild_mapping(batch: Mapping[Any, Any], items: dict[Any, Any]) -> Mapping[Any, Any]:
    """``items`` as ``batch``'s mapping type (``dict`` when that type cannot take a dict)."""
    if type(batch) is dict:
        return items
    try:
        return type(batch)(items)  # type: ignore[call-arg]
    except Exception:  # a Mapping without a dict constructor
        return items


def batch_to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` with every tensor moved to ``device`` (non-blocking; containers rebuilt)."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return _rebuild_mapping(
            batch, {key: batch_to_device(value, device) for key, value in batch.items()})
    if isinstance(batch, (list, tuple)):
        moved = [batch_to_device(value, device) for value in batch]
        return type(batch)(moved) if not hasattr(batch, "_fields") else type(batch)(*moved)
    return batch


def _first_tensor(batch: Any) -> torch.Tensor | None:
    if isinstance(batch, torch.Tensor):
        return batch
    values = batch.values() if isinstance(batch, Mapping) else batch
    if isinstance(values, (list, tuple)) or isinstance(batch, Mapping):
        for value in values:
            found = _first_tensor(value)
            if found is not None:
                return found
    return None


def num_samples(batch: Any) -> int:
    """The number of samples in ``batch``: the first dimension of its first tensor.

    Raises:
        TypeError: ``batch`` holds no tensor.
    """
    tensor = _first_tensor(batch)
    if tensor is None:
        raise TypeError(
            f"Cannot count samples in a batch of type {type(batch).__name__} with no tensors; "
            f"yield tensors, mappings (dicts) of tensors or tuples of tensors."
        )
    return int(tensor.shape[0]) if tensor.dim() > 0 else 1


def split_batch(batch: Any, microbatch_size: int) -> list[Any]:
    """Split ``batch`` along dim 0 into chunks of ``microbatch_size`` samples (the last may be
    smaller). Non-tensor values in a mapping are shared by every chunk.

    Raises:
        ValueError: ``microbatch_size`` is not positive.
    """
    if microbatch_size <= 0:
        raise ValueError(f"device_train_microbatch_size must be positive, got {microbatch_size}.")
    n = num_samples(batch)
    if microbatch_size >= n:
        return [batch]
    starts = range(0, n, microbatch_size)
    return [slice_batch(batch, start, start + microbatch_size) for start in starts]


def slice_batch(batch: Any, start: int, stop: int) -> Any:
    """Samples ``start:stop`` of ``batch`` (every tensor sliced on dim 0; other values kept)."""
    if isinstance(batch, torch.Tensor):
        return batch[start:stop]
    if isinstance(batch, Mapping):
        return _rebuild_mapping(
            batch, {key: slice_batch(value, start, stop) for key, value in batch.items()})
    if isinstance(batch, (list, tuple)):
        sliced = [slice_batch(value, start, stop) for value in batch]
        return type(batch)(sliced) if not hasattr(batch, "_fields") else type(batch)(*sliced)
    return batch
