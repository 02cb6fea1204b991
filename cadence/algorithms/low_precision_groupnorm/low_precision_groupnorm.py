"""GroupNorm run in the autocast dtype (fp16/bf16) instead of fp32 under AMP.

Under ``torch.autocast``, ``group_norm`` is on the "run in fp32" list. :class:`LPGroupNorm`
casts the input, weight and bias to the autocast dtype and runs ``group_norm`` with autocast
off, so the output stays in half precision.

Source: the API of Composer's ``LowPrecisionGroupNorm`` / ``apply_low_precision_groupnorm``
/ ``LPGroupNorm`` (``composer/algorithms/low_precision_groupnorm/``): same names, arguments,
defaults, events and no-effect warnings; Wu and He, "Group Normalization", ECCV 2018.
"""

from __future__ import annotations

import logging
import warnings
from typing import Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

from cadence.algorithms.low_precision_layernorm.low_precision_layernorm import _cast_if_autocast_enabled, is_low_precision
from cadence.algorithms.surgery import ApplyAtSurgery
from cadence.algorithms.warnings import NoEffectWarning
from cadence.registry import algorithms
from cadence.core import Precision
from cadence.utils import module_surgery

__all__ = ["LPGroupNorm", "LowPrecisionGroupNorm", "apply_low_precision_groupnorm"]

log = logging.getLogger(__name__)

Optimizers = Union[torch.optim.Optimizer, Sequence[torch.optim.Optimizer]]


class LPGroupNorm(nn.GroupNorm):
    """``nn.GroupNorm`` that, under autocast, runs in the autocast dtype (fp16/bf16).

    Same arguments, parameters and state-dict keys as ``nn.GroupNorm``; outside autocast it
    is exactly ``nn.GroupNorm``. Shapes: ``[N, C, *] -> [N, C, *]``, in the autocast dtype
    under autocast.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # cast while autocast is on (the cast reads its dtype), then run with it off
        x, weight, bias = (_cast_if_autocast_enabled(t) for t in (x, self.weight, self.bias))
        with torch.autocast(device_type=x.device.type, enabled=False):
            return F.group_norm(x, self.num_groups, weight, bias, self.eps)


def _to_lp_groupnorm(layer: nn.Module, module_index: int) -> LPGroupNorm | None:
    del module_index
    if isinstance(layer, LPGroupNorm):
        return None
    assert isinstance(layer, nn.GroupNorm)
    new = LPGroupNorm(layer.num_groups, layer.num_channels, layer.eps, layer.affine,
                      device="meta")
    new.weight, new.bias = layer.weight, layer.bias  # the same Parameters
    return new


def apply_low_precision_groupnorm(
    model: nn.Module,
    precision: Union[str, Precision, None] = None,
    optimizers: Optimizers | None = None,
) -> nn.Module:
    """Replace every ``nn.GroupNorm`` of ``model`` by an :class:`LPGroupNorm`, in place,
    when ``precision`` is ``amp_fp16`` or ``amp_bf16``; otherwise warn
    :class:`~cadence.algorithms.warnings.NoEffectWarning` and change nothing (Composer's).

    The replacements keep the original parameters (the same tensors).

    Args:
        model: the model, not yet wrapped or sharded.
        precision: the run's precision (a ``Precision`` or its string); default ``None``.
        optimizers: optimizers over ``model``'s parameters (nothing in them changes).

    Returns:
        ``model``.

    Raises:
        TypeError: ``model`` is already wrapped or sharded (naming where).
        ValueError: ``precision`` is not a known precision.
    """
    if not is_low_precision(precision):
        warnings.warn(NoEffectWarning(
            f"LowPrecisionGroupNorm only applies to amp_fp16 and amp_bf16 precisions, not "
            f"{getattr(precision, 'value', precision)!r}; the model is unchanged."), stacklevel=2)
        return model
    replaced = module_surgery.replace_module_classes(
        model, {nn.GroupNorm: _to_lp_groupnorm}, optimizers)
    if not replaced:
        warnings.warn(NoEffectWarning("LowPrecisionGroupNorm: no torch.nn.GroupNorm in the model."),
                      stacklevel=2)
    log.info("LowPrecisionGroupNorm: replaced %d GroupNorm modules.", len(replaced))
    return model


@algorithms.register("low_precision_groupnorm")
class LowPrecisionGroupNorm(ApplyAtSurgery):
    """Runs every ``nn.GroupNorm`` in the autocast dtype under ``amp_fp16`` / ``amp_bf16``:
    :func:`apply_low_precision_groupnorm` at ``apply_at``. A GroupNorm over ``[N, C, *]``
    then returns fp16/bf16 under autocast; in ``fp32`` nothing changes (a
    :class:`~cadence.algorithms.warnings.NoEffectWarning`).

    Args:
        apply_at: ``"init"`` (default), ``"before_load"`` or ``"after_load"``.

    Raises:
        ValueError: ``apply_at`` is another event.
        TypeError: at ``before_load`` / ``after_load`` when the Trainer has already wrapped
            or sharded the model (DDP, FSDP2: it does so right after ``INIT``); the message
            names where.

    Example (YAML)::

        precision: amp_fp16
        algorithms:
          low_precision_groupnorm: {}
    """

    surgery = staticmethod(apply_low_precision_groupnorm)
