"""LayerNorm run in the autocast dtype (fp16/bf16) instead of fp32 under AMP.

Under ``torch.autocast`` on CUDA, ``layer_norm`` is on the "run in fp32" list: its input is
upcast and its output is fp32; on the CPU it runs in its input's dtype, so an fp32 input (a
residual stream) gives an fp32 output. :class:`LPLayerNorm` casts the input, weight and
bias to the autocast dtype and runs ``layer_norm`` with autocast off, so the norm (and what
follows it) stays in half precision: less memory traffic, the same role as a fused
LayerNorm kernel.

Source: the API of Composer's ``LowPrecisionLayerNorm`` / ``apply_low_precision_layernorm``
/ ``LPLayerNorm`` (``composer/algorithms/low_precision_layernorm/``): same names, arguments,
defaults, events and no-effect warnings; PyTorch AMP's op lists
(https://pytorch.org/docs/stable/amp.html#autocast-op-reference).
"""

from __future__ import annotations

import logging
import warnings
from typing import Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

from cadence.algorithms.surgery import ApplyAtSurgery
from cadence.algorithms.warnings import NoEffectWarning
from cadence.registry import algorithms
from cadence.core import Precision
from cadence.utils import module_surgery

__all__ = ["LPLayerNorm", "LowPrecisionLayerNorm", "apply_low_precision_layernorm"]

log = logging.getLogger(__name__)

Optimizers = Union[torch.optim.Optimizer, Sequence[torch.optim.Optimizer]]

def _cast_if_autocast_enabled(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """``tensor`` in the autocast dtype of its device when autocast is on there, else as is."""
    if tensor is None:
        return None
    device_type = tensor.device.type
    if torch.is_autocast_enabled(device_type):
        return tensor.to(dtype=torch.get_autocast_dtype(device_type))
    return tensor


def is_low_precision(precision: Union[str, Precision, None]) -> bool:
    """Whether ``precision`` is ``amp_fp16`` or ``amp_bf16`` (a string or a Precision)."""
    return precision is not None and Precision.parse(precision) in (Precision.AMP_FP16,
                                                                    Precision.AMP_BF16)


class LPLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` that, under autocast, runs in the autocast dtype (fp16/bf16).

    Same arguments, parameters (fp32 master weights) and state-dict keys as
    ``nn.LayerNorm``; outside autocast it is exactly ``nn.LayerNorm``.
    Shapes: ``[..., *normalized_shape] -> [..., *normalized_shape]``, in the autocast dtype
    under autocast.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # cast while autocast is on (the cast reads its dtype), then run with it off
        x, weight, bias = (_cast_if_autocast_enabled(t) for t in (x, self.weight, self.bias))
        with torch.autocast(device_type=x.device.type, enabled=False):
            return F.layer_norm(x, self.normalized_shape, weight, bias, self.eps)


def _to_lp_layernorm(layer: nn.Module, module_index: int) -> LPLayerNorm | None:
    del module_index
    if isinstance(layer, LPLayerNorm):
        return None
    assert isinstance(layer, nn.LayerNorm)
    new = LPLayerNorm(layer.normalized_shape, layer.eps, layer.elementwise_affine,
                      bias=layer.bias is not None, device="meta")
    # the same Parameter objects: weights (and optimizer state) carry over untouched
    new.weight, new.bias = layer.weight, layer.bias
    return new


def apply_low_precision_layernorm(
    model: nn.Module,
    precision: Union[str, Precision, None] = None,
    optimizers: Optimizers | None = None,
) -> nn.Module:
    """Replace every ``nn.LayerNorm`` of ``model`` by an :class:`LPLayerNorm`, in place,
    when ``precision`` is ``amp_fp16`` or ``amp_bf16``.

    The replacements keep the original parameters (the same tensors), so optimizers need no
    change; ``optimizers`` is accepted for Composer's signature.

    Args:
        model: the model, not yet wrapped or sharded.
        precision: the run's precision (a :class:`~cadence.core.precision.Precision` or its
            string). Anything but ``amp_fp16`` / ``amp_bf16`` (including ``None``, the
            default) changes nothing and warns :class:`NoEffectWarning`, as Composer.
        optimizers: optimizers over ``model``'s parameters.

    Returns:
        ``model``.

    Raises:
        TypeError: ``model`` is already wrapped or sharded (naming where).
        ValueError: ``precision`` is not a known precision.
    """
    if not is_low_precision(precision):
        warnings.warn(NoEffectWarning(
            f"LowPrecisionLayerNorm only applies to amp_fp16 and amp_bf16 precisions, not "
            f"{getattr(precision, 'value', precision)!r}; the model is unchanged."), stacklevel=2)
        return model
    replaced = module_surgery.replace_module_classes(
        model, {nn.LayerNorm: _to_lp_layernorm}, optimizers)
    if not replaced:
        warnings.warn(NoEffectWarning("LowPrecisionLayerNorm: no torch.nn.LayerNorm in the model."),
                      stacklevel=2)
    log.info("LowPrecisionLayerNorm: replaced %d LayerNorm modules.", len(replaced))
    return model


@algorithms.register("low_precision_layernorm")
class LowPrecisionLayerNorm(ApplyAtSurgery):
    """Runs every ``nn.LayerNorm`` in the autocast dtype under ``amp_fp16`` / ``amp_bf16``
    (instead of autocast's fp32): :func:`apply_low_precision_layernorm` at ``apply_at``.

    A LayerNorm over ``[..., d]`` then returns fp16/bf16 ``[..., d]`` under autocast. In
    ``fp32`` it does nothing (warning :class:`NoEffectWarning`). The precision is the run's
    at ``apply_at`` (put ``MixedPrecision`` before it when that sets it).

    Args:
        apply_at: ``"init"`` (default), ``"before_load"`` or ``"after_load"`` (an
            :class:`~cadence.core.event.Event` or its value).

    Raises:
        ValueError: ``apply_at`` is another event.
        TypeError: at ``before_load`` / ``after_load`` when the Trainer has already wrapped
            or sharded the model (DDP, FSDP2: it does so right after ``INIT``); the message
            names where.

    Example (YAML)::

        precision: amp_bf16
        algorithms:
          low_precision_layernorm: {}
    """

    surgery = staticmethod(apply_low_precision_layernorm)
