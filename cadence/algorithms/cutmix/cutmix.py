"""CutMix: paste a box from another sample of the batch into each image; mix the targets
by the pasted area.

Source: Yun et al., "CutMix: Regularization Strategy to Train Strong Classifiers with
Localizable Features", ICCV 2019 (and its reference code, clovaai/CutMix-PyTorch); MosaicML
Composer's ``CutMix`` / ``cutmix_batch`` (``composer/algorithms/cutmix/cutmix.py``): same
arguments, defaults, box sampling and events, except:

- ``cutmix_batch(length=...)`` cuts a box of ``length * H`` by ``length * W`` as documented
  (Composer turns ``length`` into an area and then cuts a box of side
  ``sqrt(1 - length**2)`` of the image instead).
- Losses are mixed at ``AFTER_LOSS`` and dense targets put back there, as in
  :mod:`cadence.algorithms.mixup.mixup` (cadence releases the outputs after ``AFTER_LOSS``).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import numpy as np
import torch

from cadence.algorithms.mixup.mixup import (
    PermutationMix,
    _check_alpha,
    _check_indices,
    _require_tensors,
)
from cadence.registry import algorithms
from cadence.core import Event, State
from cadence.utils.batch_helpers import batch_get, batch_set

__all__ = ["CutMix", "cutmix_batch"]

BBox = tuple[int, int, int, int]


def cutmix_batch(
    input: torch.Tensor,
    target: torch.Tensor,
    length: Optional[float] = None,
    alpha: float = 1.0,
    bbox: Optional[tuple] = None,
    indices: Optional[torch.Tensor] = None,
    uniform_sampling: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, float, BBox]:
    """Replace one box of every image with the same box of its partner image.

    The box is the same for the whole batch. Its area fraction is ``1 - lambda`` with
    ``lambda ~ Beta(alpha, alpha)`` (the paper uses ``alpha = 1``: uniform), or fixed by
    ``length``, or given as ``bbox``. Its centre is uniform over the image, and the box is
    clipped at the borders, so the returned area is the exact fraction of pixels kept.

    Args:
        input: images ``[N, C, H, W]`` (any ``[N, ..., H, W]``).
        target: ``[N, ...]`` targets (returned permuted; mix them with the returned area).
        length: the box's side as a fraction of ``H`` and of ``W``, in ``[0, 1]``; default
            ``None`` (drawn from ``alpha``).
        alpha: the Beta parameter, ``>= 0``; 0 draws ``lambda = 0`` (a box of the image's
            size at a random centre, then clipped, as in Composer); default 1. Ignored with
            ``length`` or ``bbox``.
        bbox: ``(r1, c1, r2, c2)``: rows ``r1:r2`` (dim -2) and columns ``c1:c2`` (dim -1).
        indices: the permutation ``[N]`` choosing each image's partner; default random.
        uniform_sampling: draw the centre from a range widened by half the box, so every
            pixel is equally likely to be covered (the paper's centre favours the middle);
            default ``False``.

    Returns:
        ``(input_mixed [N, C, H, W], target_perm = target[indices], area, bbox)``, where
        ``area`` is the fraction of each image that is its own (``1 - box pixels / (H*W)``),
        the weight of ``target`` in the mixed target.

    Raises:
        ValueError: both ``length`` and ``bbox``; ``length`` outside ``[0, 1]``; a negative
            ``alpha``; ``input`` with fewer than 3 dimensions; mismatched batch sizes.
    """
    if bbox is not None and length is not None:
        raise ValueError(f"cutmix_batch: give length or bbox, not both (got length={length}, "
                         f"bbox={bbox}).")
    if input.ndim < 3:
        raise ValueError(f"cutmix_batch: input must be [N, ..., H, W], got shape "
                         f"{tuple(input.shape)}.")
    if input.shape[0] != target.shape[0]:
        raise ValueError(f"cutmix_batch: input has {input.shape[0]} samples, target "
                         f"{target.shape[0]}; they must match.")
    height, width = input.shape[-2], input.shape[-1]
    if bbox is None:
        if length is not None:
            if not 0.0 <= length <= 1.0:
                raise ValueError(f"cutmix_batch: length must be in [0, 1], got {length}.")
            cut_h, cut_w = int(length * height), int(length * width)
        else:
            ratio = float(np.sqrt(1.0 - _gen_cutmix_coef(alpha)))
            cut_h, cut_w = int(height * ratio), int(width * ratio)
        bbox = _box(height, width, cut_h, cut_w, uniform_sampling)
    r1, c1, r2, c2 = (int(v) for v in bbox)
    indices = _check_indices(indices, input.shape[0], "cutmix_batch", input.device)
    mixed = input.clone()
    mixed[..., r1:r2, c1:c2] = input[indices][..., r1:r2, c1:c2]
    return mixed, target[indices], _area_kept(height, width, (r1, c1, r2, c2)), (r1, c1, r2, c2)


def _gen_cutmix_coef(alpha: float) -> float:
    """``lambda ~ Beta(alpha, alpha)``; 0 when ``alpha`` is 0."""
    _check_alpha(alpha, "cutmix")
    return float(np.random.beta(alpha, alpha)) if alpha > 0 else 0.0


def _box(height: int, width: int, cut_h: int, cut_w: int, uniform_sampling: bool,
         cy: Optional[int] = None, cx: Optional[int] = None) -> BBox:
    """A ``cut_h x cut_w`` box (rounded down to even sides) centred at ``(cy, cx)`` (default
    random), clipped to the image: ``(r1, c1, r2, c2)``."""
    if cy is None:
        cy = (np.random.randint(-(cut_h // 2), height + cut_h // 2) if uniform_sampling
              else np.random.randint(height))
    if cx is None:
        cx = (np.random.randint(-(cut_w // 2), width + cut_w // 2) if uniform_sampling
              else np.random.randint(width))
    r1, r2 = (int(np.clip(cy + d, 0, height)) for d in (-(cut_h // 2), cut_h // 2))
    c1, c2 = (int(np.clip(cx + d, 0, width)) for d in (-(cut_w // 2), cut_w // 2))
    return r1, c1, r2, c2


def _rand_bbox(W: int, H: int, cutmix_lambda: float, cx: Optional[int] = None,
               cy: Optional[int] = None, uniform_sampling: bool = False) -> BBox:
    """Composer's private ``_rand_bbox`` (its tests call it): a box of area about
    ``1 - cutmix_lambda`` of a ``W x H`` image, ``W`` along the input's dim -2 and ``H``
    along dim -1 (Composer's naming), centred at ``(cx, cy)`` (default random; see
    :func:`cutmix_batch`'s ``uniform_sampling``), clipped. Returns ``(bbx1, bby1, bbx2,
    bby2)``, the ``bbox`` :func:`cutmix_batch` takes (``bbx`` along dim -2)."""
    ratio = float(np.sqrt(1.0 - cutmix_lambda))
    return _box(W, H, int(W * ratio), int(H * ratio), uniform_sampling, cy=cx, cx=cy)


def _area_kept(height: int, width: int, bbox: BBox) -> float:
    r1, c1, r2, c2 = bbox
    return 1.0 - max(r2 - r1, 0) * max(c2 - c1, 0) / (height * width)


@algorithms.register("cutmix")
class CutMix(PermutationMix):
    """CutMix (Yun et al. 2019): each microbatch's images get a box from their partners.

    At ``BEFORE_FORWARD`` a permutation and a box (area ``1 - lambda``,
    ``lambda ~ Beta(alpha, alpha)``; one per microbatch) are drawn and the input
    ``[N, C, H, W]`` gets the partners' pixels in the box (:func:`cutmix_batch`); ``area``
    is the fraction of pixels kept. Then, at ``BEFORE_LOSS``:

    - targets with the input's height and width (segmentation, ``[N, H, W]`` or
      ``[N, K, H, W]``): the partners' targets are pasted into the same box;
    - otherwise the targets become ``area * one_hot(y) + (1 - area) * one_hot(y[perm])``
      (shaped like the outputs ``[N, C]``, each row summing to 1), and the original labels
      are put back at ``AFTER_LOSS`` for the train metrics; or, with ``interpolate_loss``,
      the loss becomes ``area * loss(y) + (1 - area) * loss(y[perm])`` at ``AFTER_LOSS``.

    Args:
        alpha: the Beta parameter, ``>= 0``; default 1 (uniform, as in the paper).
        interpolate_loss: mix the losses instead of the targets (losses linear in the
            target only); default ``False``.
        uniform_sampling: every pixel equally likely to be in the box; default ``False``
            (the paper's sampling).
        input_key: where the input is in the batch; default 0.
        target_key: where the target is; default 1.

    Raises:
        ValueError: a negative ``alpha``; ``interpolate_loss`` with segmentation targets
            (while training).
        NotImplementedError: (while training) the input, target or outputs are not single
            tensors.

    Example (YAML)::

        algorithms:
          cutmix: {alpha: 1.0}
    """

    def __init__(
        self,
        alpha: float = 1.0,
        interpolate_loss: bool = False,
        uniform_sampling: bool = False,
        input_key: Union[str, int, tuple[Callable, Callable], Any] = 0,
        target_key: Union[str, int, tuple[Callable, Callable], Any] = 1,
    ) -> None:
        super().__init__(alpha, interpolate_loss, input_key, target_key)
        self._uniform_sampling = bool(uniform_sampling)
        self._indices = torch.Tensor()
        self._bbox: BBox = (0, 0, 0, 0)
        self._permuted_target = torch.Tensor()
        self._adjusted_lambda = 1.0

    def match(self, event: Event, state: State) -> bool:
        return event in self.events

    def apply(self, event: Event, state: State, logger: Any) -> None:
        input = batch_get(state.batch, self.input_key)
        target = batch_get(state.batch, self.target_key)
        if event == Event.BEFORE_FORWARD:
            _require_tensors("CutMix", input=input, target=target)
            self._indices = torch.randperm(input.shape[0]).to(input.device)
            mixed, self._permuted_target, self._adjusted_lambda, self._bbox = cutmix_batch(
                input, target, alpha=self.alpha, indices=self._indices,
                uniform_sampling=self._uniform_sampling)
            state.batch = batch_set(state.batch, self.input_key, mixed)
            return
        dense = (self._permuted_target.ndim > 2
                 and self._permuted_target.shape[-2:] == input.shape[-2:])
        if event == Event.BEFORE_LOSS:
            if dense:
                if self.interpolate_loss:
                    raise ValueError("CutMix: interpolate_loss=True cannot be used with targets "
                                     "of the input's height and width; set it to False.")
                r1, c1, r2, c2 = self._bbox
                pasted = target.clone()
                pasted[..., r1:r2, c1:c2] = self._permuted_target[..., r1:r2, c1:c2]
                state.batch = batch_set(state.batch, self.target_key, pasted)
            elif not self.interpolate_loss:
                self._mix_targets(state, target, self._adjusted_lambda, self._permuted_target)
            return
        # AFTER_LOSS (dense targets with interpolate_loss were refused at BEFORE_LOSS)
        self._after_loss(state, self._permuted_target, 1 - self._adjusted_lambda)
