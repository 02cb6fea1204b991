"""BlurPool: anti-aliased downsampling, by a fixed low-pass filter before each stride.

Source: Zhang, "Making Convolutional Networks Shift-Invariant Again", ICML 2019
(http://proceedings.mlr.press/v97/zhang19a.html); MosaicML Composer's ``BlurPool`` and its
layers (``composer/algorithms/blurpool/``): same names, arguments, defaults and replacement
policy (strided ``Conv2d`` with ``in_channels >= min_channels``, every ``MaxPool2d``).
"""

from __future__ import annotations

import functools
import logging
import warnings
from typing import Any, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.common_types import _size_2_t

from cadence.algorithms.surgery import InitSurgery
from cadence.algorithms.warnings import NoEffectWarning
from cadence.registry import algorithms
from cadence.core import Event, State
from cadence.utils import module_surgery
from cadence.algorithms.blurpool.blurpool_layers import (
    BlurConv2d, BlurMaxPool2d, BlurPool2d, _pair, blur_2d, blurmax_pool2d,
)

__all__ = ["BlurPool", "apply_blurpool"]

log = logging.getLogger(__name__)


def _maybe_blur_conv(module: nn.Conv2d, module_index: int, blur_first: bool,
                     min_channels: int) -> Optional[BlurConv2d]:
    if getattr(module, "_already_blurpooled", False):
        return None
    if max(_pair(module.stride)) > 1 and module.in_channels >= min_channels:
        return BlurConv2d.from_conv2d(module, module_index, blur_first=blur_first)
    return None


def apply_blurpool(model: nn.Module, replace_convs: bool = True, replace_maxpools: bool = True,
                   blur_first: bool = True, min_channels: int = 16,
                   optimizers: Optional[Union[torch.optim.Optimizer,
                                              Sequence[torch.optim.Optimizer]]] = None) -> None:
    """Add anti-aliasing blurs to ``model`` in place (Zhang 2019).

    Every ``nn.MaxPool2d`` becomes a :class:`BlurMaxPool2d` (``replace_maxpools``); every
    ``nn.Conv2d`` with a stride > 1 and ``in_channels >= min_channels`` becomes a
    :class:`BlurConv2d` (``replace_convs``) that keeps the conv's parameters. Applying it
    twice changes nothing more.

    Args:
        model: the model to modify (not yet wrapped or sharded).
        replace_convs: blur strided convolutions; default True.
        replace_maxpools: blur max-pools; default True.
        blur_first: for convs, blur before the conv (cheap) or after a stride-1 conv (the
            paper's order, costlier); see :class:`BlurConv2d`. Default True.
        min_channels: skip convs with fewer input channels (usually the RGB stem); default 16.
        optimizers: optimizers already built on ``model.parameters()`` (their parameter
            groups are updated); not needed if built after.

    Raises:
        TypeError: ``model`` is already parallelized (DDP / FSDP), from
            :func:`~cadence.utils.module_surgery.replace_module_classes`.

    Warns:
        NoEffectWarning: nothing in ``model`` was replaced.
    """
    policies: dict[Any, Any] = {}
    if replace_maxpools:
        policies[nn.MaxPool2d] = BlurMaxPool2d.from_maxpool2d
    if replace_convs:
        policies[nn.Conv2d] = functools.partial(_maybe_blur_conv, blur_first=blur_first,
                                                min_channels=min_channels)
    module_surgery.replace_module_classes(model, policies, optimizers=optimizers)
    pools = module_surgery.count_module_instances(model, BlurMaxPool2d)
    convs = module_surgery.count_module_instances(model, BlurConv2d)
    if pools == 0 and convs == 0:
        looked_for = " or ".join(
            ([f"strided Conv2d with in_channels >= {min_channels}"] if replace_convs else [])
            + (["MaxPool2d"] if replace_maxpools else []))
        warnings.warn(f"BlurPool changed nothing in {type(model).__name__}: it has no "
                      f"{looked_for}.", NoEffectWarning, stacklevel=2)
    log.info("Applied BlurPool to model %s. Model now has %d BlurMaxPool2d and %d BlurConv2D "
             "layers.", type(model).__name__, pools, convs)  # Composer's words


@algorithms.register("blurpool")
class BlurPool(InitSurgery):
    """Anti-aliased downsampling (Zhang 2019): blurs strided convolutions and max-pools at
    ``Event.INIT`` (see :func:`apply_blurpool`). Shapes are unchanged:
    ``[N, C, H, W]`` images in, the same logits out.

    Args:
        replace_convs: replace strided ``Conv2d`` with :class:`BlurConv2d`; default True.
        replace_maxpools: replace ``MaxPool2d`` with :class:`BlurMaxPool2d`; default True.
        blur_first: blur before the conv (True, default) or after it (False).
        min_channels: skip convs with fewer input channels; default 16.

    Raises:
        ValueError: both ``replace_convs`` and ``replace_maxpools`` are False.

    Logs the hyperparameters ``blurpool/num_blurpool_layers`` and
    ``blurpool/num_blurconv_layers``.

    Example (YAML)::

        algorithms:
          blurpool: {min_channels: 16}
    """

    def __init__(self, replace_convs: bool = True, replace_maxpools: bool = True,
                 blur_first: bool = True, min_channels: int = 16) -> None:
        if not replace_convs and not replace_maxpools:
            raise ValueError("BlurPool: replace_convs and replace_maxpools are both False, so "
                             "it would change nothing; set at least one to True.")
        if min_channels < 0:
            raise ValueError(f"BlurPool: min_channels must be >= 0, got {min_channels}.")
        self.replace_convs = replace_convs
        self.replace_maxpools = replace_maxpools
        self.blur_first = blur_first
        self.min_channels = min_channels

    def __repr__(self) -> str:
        return (f"BlurPool(replace_convs={self.replace_convs}, replace_maxpools="
                f"{self.replace_maxpools}, blur_first={self.blur_first}, "
                f"min_channels={self.min_channels})")

    def apply(self, event: Event, state: State, logger: Any) -> None:
        apply_blurpool(state.model, replace_convs=self.replace_convs,
                       replace_maxpools=self.replace_maxpools, blur_first=self.blur_first,
                       min_channels=self.min_channels, optimizers=state.optimizers)
        logger.log_hyperparameters({
            "blurpool/num_blurpool_layers":
                module_surgery.count_module_instances(state.model, BlurMaxPool2d),
            "blurpool/num_blurconv_layers":
                module_surgery.count_module_instances(state.model, BlurConv2d),
        })
