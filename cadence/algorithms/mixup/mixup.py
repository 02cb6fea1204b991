"""MixUp: train on convex combinations of pairs of samples and of their targets.

Source: Zhang et al., "mixup: Beyond Empirical Risk Minimization", ICLR 2018; MosaicML
Composer's ``MixUp`` / ``mixup_batch`` (``composer/algorithms/mixup/mixup.py``): same
arguments, defaults, mixing-coefficient draw and events, except where the module notes
below say otherwise.

Notes (cadence's loop):

- The loss is mixed at ``AFTER_LOSS`` with ``interpolate_loss=True`` (Composer: at
  ``BEFORE_BACKWARD``), because cadence releases ``state.outputs`` after ``AFTER_LOSS``.
  ``state.loss`` there is already weighted by the microbatch's share of the batch; the
  mixed-in loss gets the same weight.
- With mixed dense targets, the original (class index) targets are put back at
  ``AFTER_LOSS``, so the train metrics (``MulticlassAccuracy`` wants indices) score the
  predictions against each sample's own label, which has the larger weight (``mixing <=
  0.5``).
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Optional, Union

import numpy as np
import torch

from cadence.registry import algorithms
from cadence.core import Algorithm, Event, State
from cadence.loss.utils import ensure_targets_one_hot
from cadence.utils.batch_helpers import batch_get, batch_set

__all__ = ["MixUp", "mixup_batch"]


def mixup_batch(
    input: torch.Tensor,
    target: torch.Tensor,
    mixing: Optional[float] = None,
    alpha: float = 0.2,
    indices: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Mix each sample of ``input`` with another sample of the same batch.

    ``input_mixed = (1 - mixing) * input + mixing * input[indices]``, one ``mixing`` for the
    whole batch. The targets are not mixed here (class indices cannot be): mix them as
    ``(1 - mixing) * one_hot(target) + mixing * one_hot(target_perm)``, or mix the two
    losses (:class:`MixUp` does either).

    Args:
        input: ``[N, ...]`` (images ``[N, C, H, W]``), floating point.
        target: ``[N, ...]``: class indices ``[N]`` or any per-sample targets.
        mixing: the weight of the mixed-in samples, in ``[0, 1]``; ``None`` (default): drawn
            as ``min(z, 1 - z)``, ``z ~ Beta(alpha, alpha)`` (so at most 0.5: each sample
            stays the larger part of its mix).
        alpha: the Beta distribution's parameter, ``>= 0`` (0: no mixing); default 0.2.
            Used only when ``mixing`` is ``None``.
        indices: the permutation ``[N]`` (int64) that picks each sample's partner; default a
            random permutation.

    Returns:
        ``(input_mixed [N, ...], target_perm [N, ...] = target[indices], mixing)``.

    Raises:
        ValueError: ``mixing`` outside ``[0, 1]``, a negative ``alpha``, ``indices`` of the
            wrong length, or ``input`` and ``target`` with different batch sizes.
    """
    if input.shape[0] != target.shape[0]:
        raise ValueError(f"mixup_batch: input has {input.shape[0]} samples, target "
                         f"{target.shape[0]}; they must match.")
    if mixing is None:
        mixing = _gen_mixing_coef(alpha)
    elif not 0.0 <= mixing <= 1.0:
        raise ValueError(f"mixup_batch: mixing must be in [0, 1], got {mixing}.")
    indices = _check_indices(indices, input.shape[0], "mixup_batch", input.device)
    mixed = (1 - mixing) * input + mixing * input[indices]
    return mixed, target[indices], float(mixing)


def _gen_mixing_coef(alpha: float) -> float:
    """``min(z, 1 - z)`` with ``z ~ Beta(alpha, alpha)``; 0 when ``alpha`` is 0."""
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0, got {alpha}.")
    z = float(np.random.beta(alpha, alpha)) if alpha > 0 else 0.0
    return min(z, 1.0 - z)


def _check_indices(indices: Optional[torch.Tensor], n: int, owner: str,
                   device: torch.device) -> torch.Tensor:
    """A random permutation of ``n`` on ``device``, or ``indices`` checked."""
    if indices is None:
        return torch.randperm(n).to(device)
    if indices.shape != (n,):
        raise ValueError(f"{owner}: indices must have shape ({n},), got {tuple(indices.shape)}.")
    return indices.to(device)


def interpolate_loss_(state: State, model_loss_batch: Any, other_weight: float) -> None:
    """Set ``state.loss`` (at ``AFTER_LOSS``) to ``(1 - other_weight) * loss + other_weight *
    loss_on(model_loss_batch)``, the second loss weighted like the first.

    ``state.loss`` is the model's loss times the microbatch's weight in the batch; the
    weight is read back as ``state.loss / loss`` (1 when that loss is exactly 0).
    """
    model = getattr(state.model, "module", state.model)
    loss_fn = getattr(model, "loss", None) or getattr(state.model, "loss", None)
    if not callable(loss_fn):
        raise AttributeError("interpolate_loss needs the model's loss: model.loss(outputs, batch) "
                             "(or model.module.loss) is not defined.")
    if not isinstance(state.loss, torch.Tensor) or not isinstance(state.outputs, torch.Tensor):
        raise NotImplementedError("interpolate_loss supports one output tensor and one loss "
                                  "tensor only.")
    with torch.no_grad():
        own = loss_fn(state.outputs, state.batch)
    other = loss_fn(state.outputs, model_loss_batch)
    own_value = own.detach()
    weight = torch.where(own_value != 0, state.loss.detach() / own_value,
                         torch.ones_like(own_value))
    state.loss = (1 - other_weight) * state.loss + other_weight * weight * other


def _check_alpha(alpha: float, owner: str) -> float:
    if not alpha >= 0:
        raise ValueError(f"{owner}: alpha must be >= 0 (0 disables it), got {alpha}.")
    return float(alpha)


class PermutationMix(Algorithm):
    """What MixUp and CutMix share: each microbatch mixed with a permutation of itself at
    ``BEFORE_FORWARD`` (by the subclass), then the targets mixed at ``BEFORE_LOSS`` and put
    back at ``AFTER_LOSS``, or with ``interpolate_loss`` the losses mixed at ``AFTER_LOSS``.

    Raises:
        ValueError: a negative ``alpha`` (naming the subclass).
    """

    events = frozenset({Event.BEFORE_FORWARD, Event.BEFORE_LOSS, Event.AFTER_LOSS})

    def __init__(self, alpha: float, interpolate_loss: bool, input_key: Any,
                 target_key: Any) -> None:
        self.alpha = _check_alpha(alpha, type(self).__name__)
        self.interpolate_loss = bool(interpolate_loss)
        self.input_key, self.target_key = input_key, target_key
        self._original_target: Optional[torch.Tensor] = None

    def _mix_targets(self, state: State, target: torch.Tensor, own_weight: float,
                     permuted_target: torch.Tensor) -> None:
        """``BEFORE_LOSS``: the target becomes ``own_weight * one_hot(y) + (1 - own_weight)
        * one_hot(y[perm])``, shaped like the outputs; ``y`` is kept for ``AFTER_LOSS``."""
        _require_tensors(type(self).__name__, outputs=state.outputs)
        self._original_target = target
        mixed = (own_weight * ensure_targets_one_hot(state.outputs, target)
                 + (1 - own_weight) * ensure_targets_one_hot(state.outputs, permuted_target))
        state.batch = batch_set(state.batch, self.target_key, mixed)

    def _after_loss(self, state: State, permuted_target: torch.Tensor,
                    other_weight: float) -> None:
        """``AFTER_LOSS``: mix the losses (``interpolate_loss``), else put the labels back
        for the train metrics."""
        if self.interpolate_loss:
            other = batch_set(_shallow_copy(state.batch), self.target_key, permuted_target)
            interpolate_loss_(state, other, other_weight)
        elif self._original_target is not None:
            state.batch = batch_set(state.batch, self.target_key, self._original_target)
            self._original_target = None


@algorithms.register("mixup")
class MixUp(PermutationMix):
    """MixUp (Zhang et al. 2018): each microbatch is mixed with a permutation of itself.

    At ``BEFORE_FORWARD`` a mixing weight ``m = min(z, 1 - z)``, ``z ~ Beta(alpha, alpha)``,
    and a permutation are drawn per microbatch, and the input becomes
    ``(1 - m) * x + m * x[perm]`` (:func:`mixup_batch`). Then either the targets are mixed
    at ``BEFORE_LOSS`` (``(1 - m) * one_hot(y) + m * one_hot(y[perm])``, shaped like the
    outputs ``[N, C, ...]``, each row summing to 1; the loss must take class
    probabilities, as :func:`~cadence.loss.soft_cross_entropy` does) and put back at
    ``AFTER_LOSS``, or, with ``interpolate_loss``, the loss is mixed at ``AFTER_LOSS``:
    ``(1 - m) * loss(y) + m * loss(y[perm])`` (right only for losses linear in the target,
    such as cross entropy).

    Args:
        alpha: the Beta parameter, ``>= 0``; larger mixes more evenly, 0 disables mixing;
            default 0.2.
        interpolate_loss: mix the losses instead of the targets; default ``False``.
        input_key: where the input ``[N, ...]`` is in the batch
            (:func:`~cadence.utils.batch_get` keys); default 0.
        target_key: where the target ``[N, ...]`` is; default 1.

    Raises:
        ValueError: a negative ``alpha``.
        NotImplementedError: (while training) the input, target or outputs are not single
            tensors.

    Example (YAML)::

        algorithms:
          mixup: {alpha: 0.2}
    """

    def __init__(
        self,
        alpha: float = 0.2,
        interpolate_loss: bool = False,
        input_key: Union[str, int, tuple[Callable, Callable], Any] = 0,
        target_key: Union[str, int, tuple[Callable, Callable], Any] = 1,
    ) -> None:
        super().__init__(alpha, interpolate_loss, input_key, target_key)
        self.mixing = 0.0
        self.indices = torch.Tensor()
        self.permuted_target = torch.Tensor()

    def match(self, event: Event, state: State) -> bool:
        if event == Event.BEFORE_LOSS:
            return not self.interpolate_loss
        return event in (Event.BEFORE_FORWARD, Event.AFTER_LOSS)

    def apply(self, event: Event, state: State, logger: Any) -> None:
        target = batch_get(state.batch, self.target_key)
        if event == Event.BEFORE_FORWARD:
            input = batch_get(state.batch, self.input_key)
            _require_tensors("MixUp", input=input, target=target)
            self.mixing = _gen_mixing_coef(self.alpha)
            self.indices = torch.randperm(input.shape[0]).to(input.device)
            mixed, self.permuted_target, _ = mixup_batch(input, target, mixing=self.mixing,
                                                         indices=self.indices)
            state.batch = batch_set(state.batch, self.input_key, mixed)
        elif event == Event.BEFORE_LOSS:
            self._mix_targets(state, target, 1 - self.mixing, self.permuted_target)
        else:  # AFTER_LOSS
            self._after_loss(state, self.permuted_target, self.mixing)


def _require_tensors(owner: str, **values: Any) -> None:
    for name, value in values.items():
        if not isinstance(value, torch.Tensor):
            raise NotImplementedError(f"{owner} needs the {name} to be one tensor, got "
                                      f"{type(value).__name__}; set input_key/target_key to "
                                      f"name single tensors.")


def _shallow_copy(batch: Any) -> Any:
    """A shallow copy of the batch's container, so setting a key leaves ``batch`` as it is
    (tuples are copied by ``batch_set`` itself)."""
    return batch if isinstance(batch, tuple) else copy.copy(batch)
