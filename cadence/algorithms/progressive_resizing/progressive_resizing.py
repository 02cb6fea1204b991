"""Progressive resizing: train on smaller images first, growing them to full size.

Source: fast.ai's progressive resizing (Howard, fastbook chapter 7, "Progressive
resizing"), and the train/test resolution effects in Touvron et al., "Fixing the train-test
resolution discrepancy", NeurIPS 2019; MosaicML Composer's ``ProgressiveResizing`` /
``resize_batch`` (``composer/algorithms/progressive_resizing/progressive_resizing.py``):
same arguments, defaults, schedule, event and logged metrics, except:

- ``'resize'`` is nearest-neighbour interpolation (as Composer's code; its docstring says
  bilinear).
- A random crop may start at any valid offset, the last included (Composer's draw leaves
  out the last one), and the pinned width is at least one ``size_increment`` (Composer
  produces an empty image when ``initial_scale`` rounds to 0).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Union

import torch
import torch.nn.functional as F

from cadence.registry import algorithms
from cadence.core import Algorithm, Event, State
from cadence.utils.batch_helpers import batch_get, batch_set

__all__ = ["ProgressiveResizing", "resize_batch"]

log = logging.getLogger(__name__)

_VALID_MODES = ("crop", "resize")


def resize_batch(
    input: torch.Tensor,
    target: torch.Tensor,
    scale_factor: float,
    mode: str = "resize",
    resize_targets: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Shrink a batch of images (and optionally dense targets) by ``scale_factor``.

    Args:
        input: images ``[N, C, H, W]``.
        target: ``[N, ...]``; resized only with ``resize_targets``, then ``[N, H_y, W_y]``
            (class indices, resized as floats and cast back) or ``[N, K, H_y, W_y]``.
        scale_factor: the new size over the old, ``> 0``; ``>= 1`` returns the inputs as
            they are.
        mode: ``'resize'`` (nearest-neighbour interpolation, ``F.interpolate``) or
            ``'crop'`` (one random crop for the batch; the target is cropped at the same
            relative place); default ``'resize'``.
        resize_targets: resize the target too; default ``False``.

    Returns:
        ``(input [N, C, int(H * s), int(W * s)], target)``, the target resized likewise or
        unchanged.

    Raises:
        ValueError: an unknown ``mode``, ``scale_factor <= 0``, an input with fewer than 3
            dimensions, or ``resize_targets`` with a target of fewer than 3 dimensions.
    """
    if mode.lower() not in _VALID_MODES:
        raise ValueError(f"resize_batch: mode {mode!r} is not one of {_VALID_MODES}.")
    if input.ndim < 3:
        raise ValueError(f"resize_batch: input must be [N, C, H, W], got {tuple(input.shape)}.")
    if resize_targets and target.ndim < 3:
        raise ValueError(f"resize_batch: resize_targets=True needs dense targets ([N, H, W] or "
                         f"[N, K, H, W]), got shape {tuple(target.shape)}.")
    if scale_factor <= 0:
        raise ValueError(f"resize_batch: scale_factor must be > 0, got {scale_factor}.")
    if scale_factor >= 1:
        return input, target
    indices = resize_targets and target.ndim == input.ndim - 1
    y = target.float().unsqueeze(1) if indices else target
    if mode.lower() == "resize":
        new_input = _interpolate(input, scale_factor)
        if resize_targets:
            y = _interpolate(y, scale_factor)
    else:
        height, width = input.shape[-2:]
        crop_h, crop_w = int(scale_factor * height), int(scale_factor * width)
        top = int(torch.randint(height - crop_h + 1, (1,)))
        left = int(torch.randint(width - crop_w + 1, (1,)))
        new_input = input[..., top:top + crop_h, left:left + crop_w]
        if resize_targets:
            y_h, y_w = y.shape[-2:]
            y_top, y_left = int(top * y_h / height), int(left * y_w / width)
            y_crop_h, y_crop_w = int(scale_factor * y_h), int(scale_factor * y_w)
            y = y[..., y_top:y_top + y_crop_h, y_left:y_left + y_crop_w]
    if indices:
        y = y.squeeze(1).to(target.dtype)
    log.debug("Progressive resizing (scale %s, %s): (H, W) %s -> %s", scale_factor, mode,
              tuple(input.shape[-2:]), tuple(new_input.shape[-2:]))
    return new_input, y


def _interpolate(tensor: torch.Tensor, scale_factor: float) -> torch.Tensor:
    """Nearest-neighbour resize of ``[N, C, H, W]`` to ``int(H * s) x int(W * s)``."""
    return F.interpolate(tensor, scale_factor=scale_factor, mode="nearest",
                         recompute_scale_factor=False)


@algorithms.register("progressive_resizing")
class ProgressiveResizing(Algorithm):
    """Progressive resizing: the input ``[N, C, H, W]`` is shrunk early in training and
    grows linearly to full size.

    At ``AFTER_DATALOADER``, with ``t`` the elapsed fraction of ``max_duration``: the scale
    is ``initial_scale`` until ``t = delay_fraction``, grows linearly to 1 at
    ``t = 1 - finetune_fraction``, then stays 1. The new width is the scale times ``W``
    rounded to a multiple of ``size_increment`` (at least one increment), and both sides are
    scaled by that width's ratio (:func:`resize_batch`). Logs
    ``progressive_resizing/height``, ``/width`` and ``/scale_factor``. The scale depends on
    the elapsed time only, so a resumed run resizes exactly as an uninterrupted one.

    Args:
        mode: ``'resize'`` (nearest-neighbour, default) or ``'crop'`` (random crop).
        initial_scale: the starting scale, in ``[0, 1]``; default 0.5.
        finetune_fraction: the final fraction of training at full size, in ``[0, 1]``;
            default 0.2.
        delay_fraction: the first fraction of training at ``initial_scale``; default 0.5.
            ``delay_fraction + finetune_fraction <= 1``.
        size_increment: the new width is a multiple of this; default 4.
        resize_targets: resize dense targets too; default ``False``.
        input_key: where the input is in the batch; default 0.
        target_key: where the target is; default 1.

    Raises:
        ValueError: an unknown ``mode``; a fraction or scale outside ``[0, 1]``;
            ``delay_fraction + finetune_fraction > 1``; ``size_increment < 1``.
        NotImplementedError: (while training) the input or target is not one tensor.

    Example (YAML)::

        algorithms:
          progressive_resizing: {initial_scale: 0.5, delay_fraction: 0.4}
    """

    events = frozenset({Event.AFTER_DATALOADER})

    def __init__(
        self,
        mode: str = "resize",
        initial_scale: float = 0.5,
        finetune_fraction: float = 0.2,
        delay_fraction: float = 0.5,
        size_increment: int = 4,
        resize_targets: bool = False,
        input_key: Union[str, int, tuple[Callable, Callable], Any] = 0,
        target_key: Union[str, int, tuple[Callable, Callable], Any] = 1,
    ) -> None:
        if mode not in _VALID_MODES:
            raise ValueError(f"ProgressiveResizing: mode {mode!r} is not one of {_VALID_MODES}.")
        for name, value in (("initial_scale", initial_scale),
                            ("finetune_fraction", finetune_fraction),
                            ("delay_fraction", delay_fraction)):
            if not 0 <= value <= 1:
                raise ValueError(f"ProgressiveResizing: {name} must be in [0, 1], got {value}.")
        if delay_fraction + finetune_fraction > 1:
            raise ValueError(f"ProgressiveResizing: delay_fraction + finetune_fraction must be <= "
                             f"1, got {delay_fraction} + {finetune_fraction}.")
        if int(size_increment) < 1:
            raise ValueError(f"ProgressiveResizing: size_increment must be >= 1, got "
                             f"{size_increment}.")
        self.mode = mode
        self.initial_scale = float(initial_scale)
        self.finetune_fraction = float(finetune_fraction)
        self.delay_fraction = float(delay_fraction)
        self.size_increment = int(size_increment)
        self.resize_targets = bool(resize_targets)
        self.input_key, self.target_key = input_key, target_key

    def scale_at(self, elapsed: float) -> float:
        """The schedule's scale at ``elapsed`` (a fraction of ``max_duration``), before
        pinning the width to ``size_increment``."""
        ramp = 1 - self.finetune_fraction - self.delay_fraction
        if elapsed < self.delay_fraction:
            frac = 0.0
        else:
            frac = 1.0 if ramp <= 0 else min((elapsed - self.delay_fraction) / ramp, 1.0)
        return self.initial_scale + (1 - self.initial_scale) * frac

    def match(self, event: Event, state: State) -> bool:
        return event == Event.AFTER_DATALOADER

    def apply(self, event: Event, state: State, logger: Any) -> None:
        input = batch_get(state.batch, self.input_key)
        target = batch_get(state.batch, self.target_key)
        if not isinstance(input, torch.Tensor) or not isinstance(target, torch.Tensor):
            raise NotImplementedError("ProgressiveResizing needs the input and target to be "
                                      "tensors; set input_key/target_key.")
        elapsed = state.get_elapsed_duration()
        if elapsed is None:
            raise RuntimeError("ProgressiveResizing needs max_duration (its schedule is a "
                               "fraction of training).")
        scale = self.scale_at(float(elapsed.value))
        width = int(input.shape[-1])
        pinned = round(width * scale / self.size_increment) * self.size_increment
        pinned = min(max(pinned, self.size_increment), width)
        new_input, new_target = resize_batch(input, target, pinned / width, self.mode,
                                             self.resize_targets)
        state.batch = batch_set(state.batch, self.input_key, new_input)
        state.batch = batch_set(state.batch, self.target_key, new_target)
        if logger is not None:
            logger.log_metrics({
                "progressive_resizing/height": new_input.shape[-2],
                "progressive_resizing/width": new_input.shape[-1],
                "progressive_resizing/scale_factor": scale,
            })
