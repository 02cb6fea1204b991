"""ColOut: drop a random fraction of the rows and columns of images (and of dense targets).

Source: MosaicML Composer's ``ColOut`` / ``ColOutTransform`` / ``colout_batch``
(``composer/algorithms/colout/colout.py``; Composer's own method, see its method card):
same arguments, defaults, events and semantics. The per-sample form (``batch=False``) adds
:class:`ColOutTransform` to the train dataset's ``transform`` at ``FIT_START`` through
:func:`cadence.utils.misc.add_vision_dataset_transform`, which needs no torchvision.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Union

import torch

from cadence.registry import algorithms
from cadence.core import Algorithm, Event, State
from cadence.utils.batch_helpers import batch_get, batch_set
from cadence.utils.misc import add_vision_dataset_transform

__all__ = ["ColOut", "ColOutTransform", "colout_batch"]


def _as_tuple(sample: Any) -> tuple[Any, ...]:
    return tuple(sample) if isinstance(sample, (tuple, list)) else (sample,)


def _spatial_size(image: Any) -> tuple[int, int]:
    """``(H, W)`` of a tensor ``[..., H, W]`` or a ``PIL`` image."""
    if isinstance(image, torch.Tensor):
        return int(image.shape[-2]), int(image.shape[-1])
    width, height = image.size
    return int(height), int(width)


def _should_resize_target(sample: tuple[Any, ...], resize_target: Union[bool, str]) -> bool:
    """``resize_target`` itself when a bool; with ``'auto'``: whether there is a target
    with the input's height and width (a ``PIL`` image, or a tensor of 3+ dimensions)."""
    if isinstance(resize_target, bool):
        return resize_target
    if len(sample) == 1:
        return False
    target = sample[1]
    if isinstance(target, torch.Tensor) and target.ndim <= 2:
        return False
    return _spatial_size(target) == _spatial_size(sample[0])


def _drop(image: Any, rows: torch.Tensor, cols: torch.Tensor) -> Any:
    """``image`` keeping only ``rows`` and ``cols`` (sorted index tensors), same type (a
    ``PIL`` image keeps its mode and palette)."""
    if isinstance(image, torch.Tensor):
        return image.index_select(-2, rows.to(image.device)).index_select(-1, cols.to(image.device))
    import numpy as np
    import PIL.Image

    array = np.asarray(image)  # [H, W] or [H, W, C]
    kept = PIL.Image.fromarray(np.ascontiguousarray(array[rows.numpy()][:, cols.numpy()]))
    if image.mode == "P":
        kept.putpalette(image.getpalette())
    return kept


def colout_batch(
    sample: Any,
    p_row: float = 0.15,
    p_col: float = 0.15,
    resize_target: Union[bool, str] = "auto",
) -> Any:
    """Drop the same random rows and columns from an image, a batch, and optionally a target.

    ``int((1 - p_row) * H)`` rows and ``int((1 - p_col) * W)`` columns are kept, chosen at
    random and kept in order (torch's generator).

    Args:
        sample: an image or a pair ``(image, target)``; each a tensor ``[C, H, W]`` /
            ``[N, C, H, W]`` (any ``[..., H, W]``) or a ``PIL`` image.
        p_row: the fraction of rows dropped, in ``[0, 1]``; default 0.15.
        p_col: the fraction of columns dropped, in ``[0, 1]``; default 0.15.
        resize_target: whether to drop the same rows and columns from the target too;
            ``'auto'`` (default): when the target has the image's height and width.

    Returns:
        The smaller image ``[..., H', W']`` (same type and mode), or the pair
        ``(image, target)`` when the target is resized.

    Raises:
        ValueError: ``sample`` holds more than two objects, or ``resize_target`` is neither
            a bool nor ``'auto'``.
    """
    items = _as_tuple(sample)
    if len(items) > 2:
        raise ValueError(f"colout_batch: sample must be one image or an (image, target) pair, "
                         f"got {len(items)} objects.")
    _check_resize_target(resize_target, "colout_batch")
    height, width = _spatial_size(items[0])
    rows = torch.randperm(height)[:int((1 - p_row) * height)].sort().values
    cols = torch.randperm(width)[:int((1 - p_col) * width)].sort().values
    image = _drop(items[0], rows, cols)
    if _should_resize_target(items, resize_target) and len(items) == 2:
        return image, _drop(items[1], rows, cols)
    return image


def _check_resize_target(resize_target: Any, owner: str) -> None:
    if not isinstance(resize_target, bool) and resize_target != "auto":
        raise ValueError(f"{owner}: resize_target must be True, False or 'auto', got "
                         f"{resize_target!r}.")


def _check_fraction(value: float, name: str) -> float:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"ColOut: {name} must be between 0 and 1, got {value}.")
    return float(value)


class ColOutTransform:
    """A dataset transform doing :func:`colout_batch` on one sample: an image, or an
    ``(image, target)`` pair (``PIL`` images or tensors ``[C, H, W]``).

    Args:
        p_row: fraction of rows dropped; default 0.15.
        p_col: fraction of columns dropped; default 0.15.
        resize_target: as :func:`colout_batch`; default ``'auto'``.

    Example::

        dataset.transform = [ColOutTransform(p_row=0.15, p_col=0.15), to_tensor]
    """

    def __init__(self, p_row: float = 0.15, p_col: float = 0.15,
                 resize_target: Union[bool, str] = "auto") -> None:
        self.p_row = _check_fraction(p_row, "p_row")
        self.p_col = _check_fraction(p_col, "p_col")
        _check_resize_target(resize_target, "ColOutTransform")
        self.resize_target = resize_target

    def __call__(self, sample: Any) -> Any:
        return colout_batch(sample, p_row=self.p_row, p_col=self.p_col,
                            resize_target=self.resize_target)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(p_row={self.p_row}, p_col={self.p_col}, "
                f"resize_target={self.resize_target!r})")


@algorithms.register("colout")
class ColOut(Algorithm):
    """ColOut: train on images with a random ``p_row`` of rows and ``p_col`` of columns
    removed (smaller, slightly distorted images: faster steps and extra variety).

    ``batch=True`` (default): at ``AFTER_DATALOADER`` the input ``[N, C, H, W]`` becomes
    ``[N, C, int((1 - p_row) H), int((1 - p_col) W)]`` (the same rows and columns for the
    batch), and so does a target with the input's height and width when ``resize_target``
    says so. ``batch=False``: at ``FIT_START`` a :class:`ColOutTransform` is added to the
    train dataset's ``transform`` (once per dataset), so each sample gets its own rows and
    columns; the dataset must have a ``transform`` attribute (see
    :func:`~cadence.utils.misc.add_vision_dataset_transform`).

    Args:
        p_row: fraction of rows dropped, in ``[0, 1]``; default 0.15.
        p_col: fraction of columns dropped, in ``[0, 1]``; default 0.15.
        batch: per batch (default) or per sample in the dataset.
        resize_target: ``True``, ``False`` or ``'auto'`` (default): also resize targets with
            the input's height and width.
        input_key: where the input is in the batch; default 0.
        target_key: where the target is; default 1.

    Raises:
        ValueError: a fraction outside ``[0, 1]`` or a bad ``resize_target``.
        NotImplementedError: ``resize_target=True`` with ``batch=False``.
        TypeError: (at ``FIT_START``) the train dataloader is not a torch ``DataLoader`` or
            its dataset has no ``transform``.

    Example (YAML)::

        algorithms:
          colout: {p_row: 0.15, p_col: 0.15}
    """

    events = frozenset({Event.AFTER_DATALOADER, Event.FIT_START})

    def __init__(
        self,
        p_row: float = 0.15,
        p_col: float = 0.15,
        batch: bool = True,
        resize_target: Union[bool, str] = "auto",
        input_key: Union[str, int, tuple[Callable, Callable], Any] = 0,
        target_key: Union[str, int, tuple[Callable, Callable], Any] = 1,
    ) -> None:
        self.p_row = _check_fraction(p_row, "p_row")
        self.p_col = _check_fraction(p_col, "p_col")
        _check_resize_target(resize_target, "ColOut")
        if resize_target is True and not batch:
            raise NotImplementedError("ColOut: resize_target=True needs batch=True (the dataset "
                                      "transform sees only the image).")
        self.batch = bool(batch)
        self.resize_target = resize_target
        self.input_key, self.target_key = input_key, target_key
        self._transformed_datasets: weakref.WeakSet = weakref.WeakSet()

    def match(self, event: Event, state: State) -> bool:
        if self.batch:
            return event == Event.AFTER_DATALOADER
        if event != Event.FIT_START:
            return False
        return train_dataset(state, self) not in self._transformed_datasets

    def apply(self, event: Event, state: State, logger: Any) -> None:
        if not self.batch:
            dataset = train_dataset(state, self)
            add_vision_dataset_transform(dataset, ColOutTransform(self.p_row, self.p_col, False),
                                         is_tensor_transform=False)
            self._transformed_datasets.add(dataset)
            return
        input = batch_get(state.batch, self.input_key)
        target = batch_get(state.batch, self.target_key)
        if not isinstance(input, torch.Tensor) or not isinstance(target, torch.Tensor):
            raise NotImplementedError("ColOut with batch=True needs the input and target to be "
                                      "tensors; set input_key/target_key.")
        result = colout_batch((input, target), self.p_row, self.p_col, self.resize_target)
        if isinstance(result, tuple):
            state.batch = batch_set(state.batch, self.input_key, result[0])
            state.batch = batch_set(state.batch, self.target_key, result[1])
        else:
            state.batch = batch_set(state.batch, self.input_key, result)


def train_dataset(state: State, algorithm: Algorithm) -> Any:
    """The dataset of the run's train dataloader, for algorithms that add a dataset
    transform at ``FIT_START``.

    Raises:
        TypeError: no train dataloader, or one that is not a ``torch.utils.data.DataLoader``.
    """
    loader = state.dataloader if state.dataloader is not None else state.train_dataloader
    if not isinstance(loader, torch.utils.data.DataLoader):
        raise TypeError(f"{algorithm.name} adds a transform to the train dataset, so it needs a "
                        f"torch.utils.data.DataLoader; got {type(loader).__name__}.")
    return loader.dataset
