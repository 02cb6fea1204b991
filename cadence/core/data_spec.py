"""Composer's :class:`DataSpec` (a dataloader and how the Trainer moves, splits and counts
its batches), and the batch helpers behind its defaults: move a batch to a device, count its
samples, split it into microbatches.

A batch is a tensor, a mapping of tensors (and other values: a ``dict``, a Hugging Face
``BatchEncoding`` from a tokenizer, any ``collections.abc.Mapping``), or a ``list``/``tuple``
(named tuples too) of tensors, nested, with the sample dimension first (``[batch, ...]``).
A mapping comes back as its own type when that type can be built from a dict (a
``BatchEncoding`` stays a ``BatchEncoding``), else as a ``dict``.
"""

from __future__ import annotations

import collections.abc
from collections.abc import Mapping
from typing import Any, Callable, Iterable, Optional, Sequence, Union

import torch

__all__ = [
    "DataSpec", "batch_to_device", "count_tokens", "default_split_batch", "ensure_data_spec",
    "no_transform", "num_samples", "slice_batch", "split_batch", "tensor_shapes",
]

_PRIMITIVES = (int, float, str, bool)


def no_transform(batch: Any) -> Any:
    """``batch`` as it is: a :class:`DataSpec`'s default ``batch_transforms``,
    ``microbatch_transforms`` and ``device_transforms`` (a loop skips the call when a
    transform ``is no_transform``)."""
    return batch


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


def tensor_shapes(batch: Any) -> list[Any]:
    """The shapes of ``batch``'s tensors in order (host metadata: no device sync), to tell
    whether an algorithm reshaped the batch (``SeqLengthWarmup``, ``SelectiveBackprop``)."""
    if isinstance(batch, torch.Tensor):
        return [tuple(batch.shape)]
    values = batch.values() if isinstance(batch, Mapping) else batch
    if not isinstance(values, (list, tuple)) and not isinstance(batch, Mapping):
        return []
    return [shape for value in values for shape in tensor_shapes(value)]


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
    """Samples ``start:stop`` of ``batch`` (every tensor sliced on dim 0; other values kept).
    A list or tuple held by a mapping is a list of samples and is sliced itself, whatever
    it holds (strings, 0-dim tensors, ...), as Composer's ``_split_mapping`` does."""
    if isinstance(batch, torch.Tensor):
        return batch[start:stop]
    if isinstance(batch, Mapping):
        return _rebuild_mapping(batch, {
            key: (value[start:stop] if isinstance(value, (list, tuple))
                  and not hasattr(value, "_fields") else slice_batch(value, start, stop))
            for key, value in batch.items()})
    if isinstance(batch, (list, tuple)):
        sliced = [slice_batch(value, start, stop) for value in batch]
        return type(batch)(sliced) if not hasattr(batch, "_fields") else type(batch)(*sliced)
    return batch


def _is_primitive_list(batch: Any) -> bool:
    """A list or tuple of primitives of one type (a batch of strings, labels, ...)."""
    if not isinstance(batch, (list, tuple)) or hasattr(batch, "_fields"):
        return False
    if not batch:
        return True
    first = type(batch[0])
    return isinstance(batch[0], _PRIMITIVES) and all(type(item) is first for item in batch)


def default_split_batch(batch: Any, microbatch_size: Union[int, float]) -> Sequence[Any]:
    """Composer's default ``DataSpec.split_batch``: ``batch`` in microbatches of
    ``microbatch_size`` samples along dim 0 (the last may be smaller).

    A tensor, a mapping (non-tensor values shared by every microbatch) or a tuple/list of
    tensors is split as :func:`split_batch` does; a list or tuple of primitives of one type
    (strings, ints) is split as a list of samples.

    Raises:
        ValueError: ``microbatch_size`` is a float (Composer's rule) or not positive.
        TypeError: the batch holds no tensor and is not a list of primitives; give the
            :class:`DataSpec` a ``split_batch``.
    """
    if isinstance(microbatch_size, float):
        raise ValueError(f"The default split_batch needs an int microbatch_size, got "
                         f"{microbatch_size!r}; give the DataSpec a split_batch for float sizes.")
    if _is_primitive_list(batch):
        if microbatch_size <= 0:
            raise ValueError(f"microbatch_size must be positive, got {microbatch_size}.")
        return [batch[start:start + microbatch_size]
                for start in range(0, len(batch), microbatch_size)] or [batch]
    return split_batch(batch, microbatch_size)


def _split_list(l: Sequence[Any], microbatch_size: int) -> list[Any]:  # noqa: E741
    """Composer's ``_split_list``: ``l`` in slices of ``microbatch_size`` items (the last may
    be shorter; ``[l]`` when ``l`` is shorter than one slice)."""
    if len(l) < microbatch_size:
        return [l]
    return [l[start:start + microbatch_size] for start in range(0, len(l), microbatch_size)]


#: Composer's private name for :func:`default_split_batch` (llm-foundry imports it).
_default_split_batch = default_split_batch


def _dim0_sizes(batch: Any) -> list[int]:
    """The leading sizes of the tensors (and lists) in ``batch``, nested containers walked."""
    if isinstance(batch, torch.Tensor):
        return [int(batch.shape[0])] if batch.dim() > 0 else []
    if isinstance(batch, Mapping):
        sizes: list[int] = []
        for value in batch.values():
            if isinstance(value, list):
                sizes.append(len(value))
            else:
                sizes.extend(_dim0_sizes(value))
        return sizes
    if isinstance(batch, (list, tuple)):
        return [size for item in batch for size in _dim0_sizes(item)]
    return []


def count_tokens(spec: Optional["DataSpec"], host_batch: Any, device_batch: Any,
                 model_counter: Optional[Callable[[Any], Any]] = None) -> int:
    """Tokens in one batch for the timestamp: the DataSpec's ``get_num_tokens_in_batch`` when
    it was given one (called on ``device_batch``, after ``device_transforms``, as Composer
    does); else ``model_counter(host_batch)`` (cadence's ``ComposerModel.num_tokens``, on the
    host copy: no device sync) when the model has one; else the DataSpec's default count."""
    if spec is not None and spec.has_token_counter:
        return int(spec.get_num_tokens_in_batch(device_batch))
    if model_counter is not None:
        return int(model_counter(host_batch))
    if spec is not None:
        return int(spec.get_num_tokens_in_batch(device_batch))
    return 0


class DataSpec:
    """A dataloader and how the Trainer moves, splits and counts its batches (Composer's
    ``composer.core.DataSpec``, same arguments and defaults).

    Accepted wherever the Trainer takes a dataloader: ``Trainer(train_dataloader=...,
    eval_dataloader=...)``, ``Evaluator(dataloader=...)``, ``fit(train_dataloader=...,
    eval_dataloader=...)``, ``eval(eval_dataloader=...)`` and ``predict(dataloader=...)``.

    Args:
        dataloader: any iterable of batches (a ``torch.utils.data.DataLoader`` usually); the
            Trainer uses it everywhere a dataloader is used (samplers, length, resume
            position, ``state.dataloader``).
        num_samples: samples in an epoch, over all ranks; default ``len(dataloader.dataset)``
            for a ``DataLoader`` over a sized dataset, else ``None``. Stored (Composer's).
        num_tokens: tokens in an epoch, if known; stored (Composer's).
        batch_transforms: ``batch -> batch``, run by the Trainer on each batch before it is
            moved to the device and counted (CPU-side normalisation, ...); may work in place.
            Default: the batch as it is.
        microbatch_transforms: ``batch -> batch``, run on each microbatch once it is on the
            device (GPU-side work); in evaluation and prediction, on each batch. Default:
            the batch as it is.
        split_batch: ``(batch, microbatch_size) -> sequence of microbatches`` for gradient
            accumulation (``device_train_microbatch_size``). Default
            :func:`default_split_batch` (tensors, mappings, tuples of tensors, lists of
            primitives; samples on dim 0).
        get_num_samples_in_batch: ``batch -> int``, the samples a batch counts in the
            timestamp (``sp``) and in each microbatch's loss weight. Default: the common
            leading size of the batch's tensors (and lists in a mapping).
        get_num_tokens_in_batch: ``batch -> int`` (or ``-> {"total": n, "loss_generating":
            m}``, Composer's form: the timestamp counts ``"total"``), the tokens a batch
            counts in the timestamp (``tok``). Default: ``input_ids``' ``[batch, seq]`` size
            for a mapping holding ``input_ids``; else ``dataset.max_seq_len`` times the samples when the dataset
            has one; else 0. (Given no counter here, the Trainer first asks the model's
            ``num_tokens(batch)`` when it has one: cadence's models count loss tokens.)
        device_transforms: older Composer's name (keyword only): ``batch -> batch`` on each
            whole batch right after it is moved to the device. Default: none.

    Raises:
        ValueError: a ``DataLoader`` whose iterator is already running (a persistent-worker
            loader iterated before), as Composer refuses.
    """

    def __init__(
        self,
        dataloader: Union[Iterable[Any], torch.utils.data.DataLoader],
        num_samples: Optional[int] = None,
        num_tokens: Optional[int] = None,
        batch_transforms: Optional[Callable[[Any], Any]] = None,
        microbatch_transforms: Optional[Callable[[Any], Any]] = None,
        split_batch: Optional[Callable[[Any, Union[int, float]], Sequence[Any]]] = None,
        get_num_samples_in_batch: Optional[Callable[[Any], Union[int, float]]] = None,
        get_num_tokens_in_batch: Optional[Callable[[Any], Union[int, dict[str, int]]]] = None,
        *,
        device_transforms: Optional[Callable[[Any], Any]] = None,
    ) -> None:
        if isinstance(dataloader, DataSpec):
            raise TypeError("DataSpec(dataloader=...) got a DataSpec; pass its .dataloader, or "
                            "the DataSpec itself where a dataloader is taken.")
        self.dataloader = dataloader
        self.num_tokens = num_tokens
        self.batch_transforms = batch_transforms or self._default_device_transforms
        self.microbatch_transforms = microbatch_transforms or self._default_device_transforms
        self.device_transforms = device_transforms or self._default_device_transforms
        self.split_batch = split_batch or default_split_batch
        self.get_num_samples_in_batch = (get_num_samples_in_batch
                                         or self._default_get_num_samples_in_batch)
        self._get_num_tokens_in_batch = (get_num_tokens_in_batch
                                         or self._default_get_num_tokens_in_batch)
        self.has_token_counter = get_num_tokens_in_batch is not None
        if num_samples is None and isinstance(dataloader, torch.utils.data.DataLoader) \
                and isinstance(dataloader.dataset, collections.abc.Sized):
            try:
                num_samples = len(dataloader.dataset)
            except (TypeError, NotImplementedError):
                num_samples = None
        self.num_samples = num_samples
        if isinstance(dataloader, torch.utils.data.DataLoader) \
                and getattr(dataloader, "_iterator", None) is not None:
            raise ValueError("The dataloader has an active iterator (persistent_workers=True and "
                             "already iterated, or stopped mid-epoch); pass a dataloader that "
                             "has not been iterated yet.")

    def __repr__(self) -> str:
        return f"DataSpec(dataloader={self.dataloader!r})"

    def batch_on_device(self, batch: Any, device: torch.device) -> Any:
        """``batch`` as the Trainer uses it: ``batch_transforms``, moved to ``device``
        (:func:`batch_to_device`), then ``device_transforms``."""
        return self.device_transforms(batch_to_device(self.batch_transforms(batch), device))

    _default_device_transforms = staticmethod(no_transform)

    def _default_get_num_samples_in_batch(self, batch: Any) -> int:
        """The leading size shared by every tensor (and list in a mapping) of ``batch``.

        Raises:
            ValueError: the batch holds no tensor (nor list in a mapping).
            NotImplementedError: its tensors disagree on the leading size; give the DataSpec
                a ``get_num_samples_in_batch``.
        """
        sizes = _dim0_sizes(batch)
        if not sizes:
            raise ValueError(
                f"Cannot count the samples in a batch of type {type(batch).__name__}: it holds "
                f"no tensor. Use a DataSpec with get_num_samples_in_batch=your_function.")
        if len(set(sizes)) != 1:
            raise NotImplementedError(
                f"Cannot count the samples in a batch whose tensors have different leading "
                f"sizes {sizes}; use a DataSpec with get_num_samples_in_batch=your_function.")
        return sizes[0]

    def get_num_tokens_in_batch(self, batch: Any, token_type: str = "total") -> int:
        """The tokens in ``batch``, from the ``get_num_tokens_in_batch`` given to the
        DataSpec (or the default count). A counter may return an int (or a 0-dim tensor) or,
        as Composer allows, a dict of counts by type (``{"total": n, "loss_generating": m}``):
        then ``token_type`` picks one (default ``"total"``).

        Raises:
            ValueError: the counter's dict has no ``token_type`` key, or it returned neither
                a number nor a dict.
        """
        counted = self._get_num_tokens_in_batch(batch)
        if isinstance(counted, Mapping):
            if token_type not in counted:
                raise ValueError(f"Token type {token_type!r} not found in the dict that "
                                 f"get_num_tokens_in_batch returned (keys: {sorted(counted)}).")
            counted = counted[token_type]
        if isinstance(counted, torch.Tensor) and counted.numel() == 1:
            return int(counted.item())
        if isinstance(counted, (int, float)) and not isinstance(counted, bool):
            return int(counted)
        raise ValueError(f"get_num_tokens_in_batch returned {type(counted).__name__}; it must "
                         f"return an int or a dict of ints by token type "
                         f"({{'total': n, 'loss_generating': m}}).")

    def _default_get_num_tokens_in_batch(self, batch: Any) -> int:
        if isinstance(batch, Mapping) and "input_ids" in batch:
            input_ids = batch["input_ids"]
            return int(input_ids.shape[0] * input_ids.shape[1]) if input_ids.dim() > 1 \
                else int(input_ids.shape[0])
        max_seq_len = getattr(getattr(self.dataloader, "dataset", None), "max_seq_len", None)
        if max_seq_len is not None:
            return int(max_seq_len) * int(self.get_num_samples_in_batch(batch))
        return 0


def ensure_data_spec(dataloader: Union[DataSpec, Iterable[Any], dict[str, Any]]) -> DataSpec:
    """``dataloader`` as a :class:`DataSpec`: a DataSpec as it is, a dict as DataSpec's
    keyword arguments, anything else wrapped with the defaults (Composer's)."""
    if isinstance(dataloader, DataSpec):
        return dataloader
    if isinstance(dataloader, dict):
        return DataSpec(**dataloader)
    return DataSpec(dataloader)
