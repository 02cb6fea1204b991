"""Gradient clipping by total norm, by value, or adaptively per unit (AGC), applied once
per batch after accumulation.

Source: Pascanu et al., "On the difficulty of training recurrent neural networks", ICML 2013
(norm clipping); PyTorch's ``torch.nn.utils.clip_grad_norm_`` / ``clip_grad_value_``; Brock
et al., "High-Performance Large-Scale Image Recognition Without Normalization", ICML 2021
(adaptive gradient clipping); MosaicML Composer's ``apply_gradient_clipping``
(``composer/algorithms/gradient_clipping/gradient_clipping.py``), same arguments.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Iterable, Sequence, Union

import torch
from torch import nn

from cadence.core import Algorithm, Event, State
from cadence.parallel.grad_norm import clip_grad_norm_
from cadence.registry import algorithms

__all__ = ["ClippingType", "GradientClipping", "apply_gradient_clipping", "unitwise_norm"]


class ClippingType(str, Enum):
    """``norm``: rescale all gradients so their total L2 norm is at most the threshold;
    ``value``: clamp each gradient entry to ``[-threshold, threshold]``;
    ``adaptive``: rescale each unit's gradient so that its norm is at most ``threshold``
    times the unit's weight norm (see :func:`unitwise_norm`)."""

    NORM = "norm"
    VALUE = "value"
    ADAPTIVE = "adaptive"


def unitwise_norm(tensor: torch.Tensor) -> torch.Tensor:
    """The L2 norm per output unit (Brock et al. 2021): over the whole tensor for scalars
    and 1-D tensors (biases, gains), else over every dimension but the first (a Linear
    weight ``[out, in]`` -> ``[out, 1]``; a conv weight ``[out, in, kh, kw]`` ->
    ``[out, 1, 1, 1]``), kept broadcastable against ``tensor``."""
    if tensor.ndim <= 1:
        return torch.linalg.vector_norm(tensor, ord=2)
    return torch.linalg.vector_norm(tensor, ord=2, dim=tuple(range(1, tensor.ndim)),
                                    keepdim=True)


def _adaptive_clip_(params: list[nn.Parameter], clipping_threshold: float) -> None:
    """Scale each unit's gradient by ``min(1, threshold * |W| / |G|)``.

    As in Composer, a unit whose weight norm is 0 gets a coefficient of 0 (its gradient is
    zeroed) and ``0 / 0`` (zero weights and gradient) becomes 1; Brock et al. floor the
    weight norm at ``eps = 1e-3`` instead, which Composer (and so cadence) does not.
    """
    with torch.no_grad():
        for param in params:
            grad = param.grad
            assert grad is not None
            max_norm = unitwise_norm(param.detach()) * clipping_threshold
            coeff = (max_norm / unitwise_norm(grad)).nan_to_num_(nan=1.0).clamp_(max=1.0)
            grad.mul_(coeff)


def apply_gradient_clipping(
    model: Union[nn.Module, Iterable[nn.Parameter]],
    clipping_type: str,
    clipping_threshold: float,
    fsdp_enabled: bool = False,
) -> torch.Tensor | None:
    """Clip the gradients of ``model``'s parameters in place.

    Args:
        model: a module (Composer's form), or an iterable of parameters; parameters
            without a gradient are skipped.
        clipping_type: ``"norm"``, ``"value"`` or ``"adaptive"`` (or a one-element tuple
            or list of one).
        clipping_threshold: the max total L2 norm (``norm``), the max absolute value
            (``value``), or the max ratio of a unit's gradient norm to its weight norm
            (``adaptive``; Brock et al. use 0.01 for large batches); > 0.
        fsdp_enabled: whether the model is sharded with FSDP (Composer's argument). Under
            FSDP2 the gradients are DTensors, which every clipping type handles directly
            (norms are reduced over the mesh), so this changes nothing; it is accepted so
            Composer code runs unchanged.

    Returns:
        The total gradient norm before clipping (a 0-d tensor) for ``norm``, else ``None``.

    Raises:
        ValueError: unknown ``clipping_type`` or a non-positive threshold.
    """
    del fsdp_enabled  # FSDP2's DTensor gradients need no special path
    kind = _parse_type(clipping_type)
    if clipping_threshold <= 0:
        raise ValueError(f"clipping_threshold must be > 0, got {clipping_threshold}.")
    parameters = model.parameters() if isinstance(model, nn.Module) else model
    params = [p for p in parameters if p.requires_grad and p.grad is not None]  # not frozen
    if kind == ClippingType.NORM:
        return clip_grad_norm_(params, max_norm=clipping_threshold)  # any meshes
    if kind == ClippingType.VALUE:
        torch.nn.utils.clip_grad_value_(params, clip_value=clipping_threshold)
    else:
        _adaptive_clip_(params, clipping_threshold)
    return None


def _parse_type(clipping_type: Union[str, Sequence[str]]) -> ClippingType:
    """``clipping_type`` as a :class:`ClippingType`; a one-element tuple or list is its
    element (Composer's own tests pass ``('norm',)``)."""
    if isinstance(clipping_type, (tuple, list)) and len(clipping_type) == 1:
        clipping_type = clipping_type[0]
    try:
        return ClippingType(clipping_type)
    except ValueError:
        allowed = ", ".join(t.value for t in ClippingType)
        raise ValueError(f"clipping_type {clipping_type!r} is not one of: {allowed}.") from None


@algorithms.register("gradient_clipping")
class GradientClipping(Algorithm):
    """Clips gradients at ``AFTER_TRAIN_BATCH``, when they are final for the step.

    Under pipeline parallelism ``norm`` clips by the whole model's norm (each rank's stages
    combined over the pipeline ranks); ``value`` and ``adaptive`` act per entry and per
    unit, so each rank clips its own.

    Args:
        clipping_type: ``"norm"`` (default), ``"value"`` or ``"adaptive"`` (AGC); a
            one-element tuple or list of one is taken as its element.
        clipping_threshold: max total L2 norm, max absolute entry, or max ratio of a
            unit's gradient norm to its weight norm (adaptive); default 1.0.

    Example (YAML)::

        algorithms:
          gradient_clipping: {clipping_type: norm, clipping_threshold: 1.0}
    """

    events = frozenset({Event.AFTER_TRAIN_BATCH})

    def __init__(self, clipping_type: str = "norm", clipping_threshold: float = 1.0) -> None:
        self.clipping_type = _parse_type(clipping_type).value
        if clipping_threshold <= 0:
            raise ValueError(f"clipping_threshold must be > 0, got {clipping_threshold}.")
        self.clipping_threshold = float(clipping_threshold)

    def match(self, event: Event, state: State) -> bool:
        return event == Event.AFTER_TRAIN_BATCH

    def apply(self, event: Event, state: State, logger: Any) -> None:
        dims = state.parallel_dims
        if self.clipping_type == "norm" and dims is not None and dims.pp_enabled:
            # this rank holds some stages: the norm is the whole model's, over the pipeline
            params = [p for p in state.model.parameters() if p.requires_grad]
            clip_grad_norm_(params, self.clipping_threshold,
                            pipeline_group=dims.pipeline_group())
            return
        apply_gradient_clipping(
            state.model, self.clipping_type, self.clipping_threshold
        )
