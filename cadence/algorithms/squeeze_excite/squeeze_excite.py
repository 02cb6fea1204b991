"""SqueezeExcite: a channel-attention block after each wide enough ``Conv2d``.

Source: Hu, Shen, Albanie, Sun and Wu, "Squeeze-and-Excitation Networks", CVPR 2018
(https://arxiv.org/abs/1709.01507); MosaicML Composer's ``SqueezeExcite``,
``SqueezeExcite2d``, ``SqueezeExciteConv2d`` and ``apply_squeeze_excite``
(``composer/algorithms/squeeze_excite/squeeze_excite.py``): same names, arguments, defaults
(``latent_channels=64``, ``min_channels=128``) and ``Event.INIT``.
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Sequence, Union

import torch
from torch import nn

from cadence.algorithms.surgery import InitSurgery
from cadence.registry import algorithms
from cadence.core import Event, State
from cadence.utils import module_surgery

__all__ = ["SqueezeExcite", "SqueezeExcite2d", "SqueezeExciteConv2d", "apply_squeeze_excite"]

log = logging.getLogger(__name__)


def _latent_size(latent_channels: float, num_features: int) -> int:
    """An absolute width (``latent_channels >= 1``) or a fraction of ``num_features``
    (``< 1``), at least 1."""
    if latent_channels <= 0:
        raise ValueError(f"latent_channels must be > 0 (a width, or a fraction of the "
                         f"channels below 1), got {latent_channels}.")
    if latent_channels >= 1:
        return int(latent_channels)
    return max(1, int(latent_channels * num_features))


class SqueezeExcite2d(nn.Module):
    """A Squeeze-and-Excitation block (Hu et al. 2018): ``[N, C, H, W] -> [N, C, H, W]``.

    Squeeze: the global average over H and W, ``[N, C]``. Excite: ``Linear(C, latent)`` (no
    bias), ReLU, ``Linear(latent, C)`` (no bias), sigmoid, giving one gate in ``(0, 1)`` per
    sample and channel. Output: the input scaled by its gates.

    Args:
        num_features: ``C``, the input's channels.
        latent_channels: the hidden width: an int ``>= 1``, or a fraction ``< 1`` of
            ``num_features`` (at least 1); default 0.125 (the paper's reduction ratio 8).

    Raises:
        ValueError: ``latent_channels <= 0``.
    """

    def __init__(self, num_features: int, latent_channels: float = 0.125) -> None:
        super().__init__()
        self.latent_channels = _latent_size(latent_channels, num_features)
        self.pool_and_mlp = nn.Sequential(
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(num_features, self.latent_channels, bias=False),
            nn.ReLU(),
            nn.Linear(self.latent_channels, num_features, bias=False),
            nn.Sigmoid(),
        )

    def gates(self, input: torch.Tensor) -> torch.Tensor:
        """The per-channel gates ``[N, C]``, each in ``(0, 1)``."""
        return self.pool_and_mlp(input)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        n, c = input.shape[:2]
        return input * self.gates(input).reshape(n, c, 1, 1)


class SqueezeExciteConv2d(nn.Module):
    """A ``Conv2d`` followed by a :class:`SqueezeExcite2d` over its output channels:
    ``[N, C_in, H, W] -> [N, C_out, H', W']``.

    Args:
        *args, **kwargs: ``Conv2d``'s arguments, to build a new conv when ``conv`` is None.
        latent_channels: the SE block's hidden width (see :class:`SqueezeExcite2d`);
            default 0.125.
        conv: an existing conv to wrap (kept as ``self.conv``, its parameters unchanged).
    """

    def __init__(self, *args: Any, latent_channels: float = 0.125,
                 conv: Optional[nn.Conv2d] = None, **kwargs: Any) -> None:
        super().__init__()
        self.conv = nn.Conv2d(*args, **kwargs) if conv is None else conv
        self.conv._already_squeeze_excited = True  # type: ignore[assignment]  # wrap once
        self.se = SqueezeExcite2d(self.conv.out_channels, latent_channels=latent_channels)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self.se(self.conv(input))

    @staticmethod
    def from_conv2d(module: nn.Conv2d, module_index: int = -1,
                    latent_channels: float = 0.125) -> SqueezeExciteConv2d:
        """``module`` wrapped with an SE block (a surgery policy; ``module_index`` unused).
        The new block's parameters are on ``module``'s device and dtype."""
        del module_index
        block = SqueezeExciteConv2d(conv=module, latent_channels=latent_channels)
        block.se.to(device=module.weight.device, dtype=module.weight.dtype)
        return block


def apply_squeeze_excite(model: nn.Module, latent_channels: float = 64, min_channels: int = 128,
                         optimizers: Optional[Union[torch.optim.Optimizer,
                                                    Sequence[torch.optim.Optimizer]]] = None
                         ) -> None:
    """Put a :class:`SqueezeExcite2d` after every ``Conv2d`` of ``model`` with
    ``min(in_channels, out_channels) >= min_channels``, in place (Hu et al. 2018). Each such
    conv becomes a :class:`SqueezeExciteConv2d` around it; convs already wrapped are skipped.

    Args:
        model: the model to modify (not yet wrapped or sharded).
        latent_channels: each SE block's hidden width: an int, or a fraction (< 1) of the
            conv's output channels; default 64.
        min_channels: the narrowest conv that gets a block; default 128 (SE blocks cost
            least deep in a network, where channels are many and feature maps small).
        optimizers: optimizers built on ``model.parameters()``: the SE blocks' new
            parameters join the group of the conv they follow. Not needed if built after.

    Raises:
        ValueError: ``latent_channels <= 0`` or ``min_channels < 0``.
        TypeError: ``model`` is already parallelized (DDP / FSDP).
    """
    _latent_size(latent_channels, 1)  # checked before the model is touched
    if min_channels < 0:
        raise ValueError(f"min_channels must be >= 0, got {min_channels}.")

    def maybe_wrap(module: nn.Module, module_index: int) -> Optional[nn.Module]:
        conv: nn.Conv2d = module  # type: ignore[assignment]
        if getattr(conv, "_already_squeeze_excited", False):
            return None
        if min(conv.in_channels, conv.out_channels) < min_channels:
            return None
        return SqueezeExciteConv2d.from_conv2d(conv, module_index, latent_channels)

    module_surgery.replace_module_classes(model, {nn.Conv2d: maybe_wrap}, optimizers=optimizers)


@algorithms.register("squeeze_excite")
class SqueezeExcite(InitSurgery):
    """Squeeze-and-Excitation (Hu et al. 2018) at ``Event.INIT``: a channel-attention block
    after each ``Conv2d`` with ``min(in_channels, out_channels) >= min_channels``, which
    scales each ``[N, C, H, W]`` output channel by a gate in ``(0, 1)`` computed from the
    channel means (see :class:`SqueezeExcite2d`, :func:`apply_squeeze_excite`).

    Args:
        latent_channels: each block's hidden width: an int, or a fraction (< 1) of the
            conv's output channels; default 64.
        min_channels: the narrowest conv that gets a block; default 128.

    Raises:
        ValueError: ``latent_channels <= 0`` or ``min_channels < 0``.

    Logs the hyperparameter ``squeeze_excite/num_squeeze_excite_layers``.

    Example (YAML)::

        algorithms:
          squeeze_excite: {latent_channels: 0.25, min_channels: 64}
    """

    def __init__(self, latent_channels: float = 64, min_channels: int = 128) -> None:
        _latent_size(latent_channels, 1)
        if min_channels < 0:
            raise ValueError(f"SqueezeExcite: min_channels must be >= 0, got {min_channels}.")
        self.latent_channels = latent_channels
        self.min_channels = min_channels

    def __repr__(self) -> str:
        return (f"SqueezeExcite(latent_channels={self.latent_channels}, "
                f"min_channels={self.min_channels})")

    def apply(self, event: Event, state: State, logger: Any) -> None:
        apply_squeeze_excite(state.model, latent_channels=self.latent_channels,
                             min_channels=self.min_channels, optimizers=state.optimizers)
        count = module_surgery.count_module_instances(state.model, SqueezeExciteConv2d)
        log.info("Applied SqueezeExcite to %s: %d SqueezeExcite layers.",
                 type(state.model).__name__, count)
        logger.log_hyperparameters({"squeeze_excite/num_squeeze_excite_layers": count})
