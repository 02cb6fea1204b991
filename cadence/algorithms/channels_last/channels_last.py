"""ChannelsLast: keep a convolutional model's 4-D weights in NHWC memory order.

Source: PyTorch's channels-last memory format
(https://pytorch.org/tutorials/intermediate/memory_format_tutorial.html); MosaicML
Composer's ``ChannelsLast`` / ``apply_channels_last``
(``composer/algorithms/channels_last/channels_last.py``): same names, no arguments,
``Event.INIT``.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from cadence.registry import algorithms
from cadence.core import Algorithm, Event, State

__all__ = ["ChannelsLast", "apply_channels_last"]

log = logging.getLogger(__name__)


def apply_channels_last(model: nn.Module) -> None:
    """Store every 4-D parameter and buffer of ``model`` in ``torch.channels_last`` order,
    in place.

    A conv weight ``[C_out, C_in, kH, kW]`` keeps its shape and values; only its strides
    change (``weight.is_contiguous(memory_format=torch.channels_last)`` becomes True), so
    cuDNN picks its NHWC kernels, which are faster on tensor-core GPUs, and a conv's output
    is channels-last too. Tensors of other ranks are untouched. The parameters stay the same
    ``Parameter`` objects, so optimizers built on them keep working.

    Args:
        model: the model to modify (``nn.Module.to(memory_format=...)``).
    """
    model.to(memory_format=torch.channels_last)


@algorithms.register("channels_last")
class ChannelsLast(Algorithm):
    """Puts the model's 4-D weights in channels-last (NHWC) memory order at ``Event.INIT``,
    before the Trainer shards or wraps it (see :func:`apply_channels_last`). Inputs
    ``[N, C, H, W]`` and outputs keep their shapes. No arguments.

    Example (YAML)::

        algorithms:
          channels_last: {}
    """

    events = frozenset({Event.INIT})

    def __init__(self) -> None:
        pass

    def __repr__(self) -> str:
        return "ChannelsLast()"

    def match(self, event: Event, state: State) -> bool:
        return event == Event.INIT

    def apply(self, event: Event, state: State, logger: Any) -> None:
        apply_channels_last(state.model)
        log.info("Model %s changed to channels_last format.", type(state.model).__name__)
