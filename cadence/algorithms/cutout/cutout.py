"""CutOut: zero out square holes of the input images.

Source: DeVries & Taylor, "Improved Regularization of Convolutional Neural Networks with
Cutout", 2017 (and its reference code); MosaicML Composer's ``CutOut`` / ``cutout_batch``
(``composer/algorithms/cutout/cutout.py``): same arguments, defaults, event and hole
sampling (the same holes for the whole batch; a hole's side is rounded down to even, as in
the reference code).
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar, Union

import numpy as np
import torch

from cadence.registry import algorithms
from cadence.core import Algorithm, Event, State
from cadence.utils.batch_helpers import batch_get, batch_set

__all__ = ["CutOut", "cutout_batch"]

ImgT = TypeVar("ImgT")


def cutout_batch(input: ImgT, num_holes: int = 1, length: float = 0.5,
                 uniform_sampling: bool = False) -> ImgT:
    """``input`` with ``num_holes`` square holes set to zero (the same holes in every image).

    Each hole has side ``int(length * min(H, W))`` (rounded down to even) and a centre drawn
    uniformly over the image (the hole is clipped at the borders, so it may be smaller), or,
    with ``uniform_sampling``, over the image widened by half a side, so that every pixel is
    equally likely to be covered. Holes may overlap.

    Args:
        input: a ``PIL`` image, or a tensor ``[C, H, W]`` / ``[N, C, H, W]`` (any
            ``[..., H, W]``).
        num_holes: how many holes, ``>= 0``; default 1.
        length: the side as a fraction of ``min(H, W)``, in ``[0, 1]``; default 0.5.
        uniform_sampling: widen the centre's range; default ``False`` (the paper's).

    Returns:
        The same type and shape as ``input``: a new tensor (``input`` is not changed), or a
        new ``PIL`` image.

    Raises:
        ValueError: a negative ``num_holes`` or ``length`` outside ``[0, 1]``.
    """
    _check_args(num_holes, length, "cutout_batch")
    if not isinstance(input, torch.Tensor):
        from cadence.algorithms.utils.augmentation_common import image_as_type

        return image_as_type(cutout_batch(image_as_type(input, torch.Tensor), num_holes,
                                          length, uniform_sampling), type(input))
    height, width = input.shape[-2], input.shape[-1]
    side = int(min(height, width) * length)
    mask = torch.ones((height, width), dtype=input.dtype, device=input.device)
    for _ in range(num_holes):
        if uniform_sampling:
            cy = np.random.randint(-(side // 2), height + side // 2)
            cx = np.random.randint(-(side // 2), width + side // 2)
        else:
            cy, cx = np.random.randint(height), np.random.randint(width)
        r1, r2 = (int(np.clip(cy + d, 0, height)) for d in (-(side // 2), side // 2))
        c1, c2 = (int(np.clip(cx + d, 0, width)) for d in (-(side // 2), side // 2))
        mask[r1:r2, c1:c2] = 0
    return input * mask


def _check_args(num_holes: int, length: float, owner: str) -> None:
    if not isinstance(num_holes, int) or isinstance(num_holes, bool) or num_holes < 0:
        raise ValueError(f"{owner}: num_holes must be an integer >= 0, got {num_holes!r}.")
    if not 0.0 <= length <= 1.0:
        raise ValueError(f"{owner}: length must be in [0, 1] (a fraction of min(H, W)), got "
                         f"{length}.")


@algorithms.register("cutout")
class CutOut(Algorithm):
    """CutOut (DeVries & Taylor 2017): zero ``num_holes`` squares of every batch's input.

    Runs at ``AFTER_DATALOADER`` on the input ``[N, C, H, W]`` (shape unchanged; the same
    holes for the whole batch); see :func:`cutout_batch`.

    Args:
        num_holes: holes per batch; default 1.
        length: a hole's side as a fraction of ``min(H, W)``; default 0.5.
        uniform_sampling: every pixel equally likely to be covered; default ``False``.
        input_key: where the input is in the batch; default 0.

    Raises:
        ValueError: a negative ``num_holes`` or ``length`` outside ``[0, 1]``.
        NotImplementedError: (while training) the input is not one tensor.

    Example (YAML)::

        algorithms:
          cutout: {num_holes: 1, length: 0.5}
    """

    events = frozenset({Event.AFTER_DATALOADER})

    def __init__(self, num_holes: int = 1, length: float = 0.5, uniform_sampling: bool = False,
                 input_key: Union[str, int, tuple[Callable, Callable], Any] = 0) -> None:
        _check_args(num_holes, length, "CutOut")
        self.num_holes = num_holes
        self.length = float(length)
        self.uniform_sampling = bool(uniform_sampling)
        self.input_key = input_key

    def match(self, event: Event, state: State) -> bool:
        return event == Event.AFTER_DATALOADER

    def apply(self, event: Event, state: State, logger: Any) -> None:
        input = batch_get(state.batch, self.input_key)
        if not isinstance(input, torch.Tensor):
            raise NotImplementedError(f"CutOut needs the input to be one tensor, got "
                                      f"{type(input).__name__}; set input_key.")
        state.batch = batch_set(state.batch, self.input_key,
                                cutout_batch(input, self.num_holes, self.length,
                                             self.uniform_sampling))
