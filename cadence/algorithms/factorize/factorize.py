"""Factorize: ``Conv2d`` and ``Linear`` layers replaced by low-rank pairs.

Each wide enough layer whose factorization lowers its multiply-adds becomes a
:class:`~cadence.algorithms.factorize.factorize_modules.FactorizedConv2d` (``k x k`` conv to few
channels, then ``1 x 1`` conv) or
:class:`~cadence.algorithms.factorize.factorize_modules.FactorizedLinear` (two thin matrices),
initialized with the best low-rank approximation of the layer's weight.

Source: MosaicML Composer's ``Factorize`` / ``apply_factorization``
(``composer/algorithms/factorize/factorize.py``): same names, arguments, defaults (which
differ between the two, as there), ``Event.INIT`` and logged keys; the solvers and modules
are in :mod:`cadence.algorithms.factorize.factorize_modules`. The method: low-rank approximation of
layers (Denton et al., "Exploiting Linear Structure Within Convolutional Networks for
Efficient Evaluation", NeurIPS 2014, https://arxiv.org/abs/1404.0736; Zhang et al. 2016,
https://arxiv.org/abs/1505.06798).
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Sequence, Union

import torch
from torch import nn

from cadence.algorithms.factorize.factorize_modules import (
    FactorizedConv2d,
    FactorizedLinear,
    LowRankSolution,
    factorize_conv2d,
    factorize_matrix,
    factorizing_could_speedup,
)
from cadence.algorithms.surgery import InitSurgery
from cadence.registry import algorithms
from cadence.core import Event, State
from cadence.utils import module_surgery

__all__ = ["Factorize", "FactorizedConv2d", "FactorizedLinear", "LowRankSolution",
           "apply_factorization", "factorize_conv2d", "factorize_matrix",
           "factorizing_could_speedup"]

log = logging.getLogger(__name__)

LOG_NUM_CONV2D_REPLACEMENTS_KEY = "factorize/num_conv2d_replacements"
LOG_NUM_LINEAR_REPLACEMENTS_KEY = "factorize/num_linear_replacements"

Optimizers = Union[torch.optim.Optimizer, Sequence[torch.optim.Optimizer]]


def _check_latent(name: str, value: Union[int, float]) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"{name} must be a positive int (a width) or a fraction in (0, 1), "
                         f"got {value!r}.")


def _check_min(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}.")


def apply_factorization(model: nn.Module, factorize_convs: bool = True,
                        factorize_linears: bool = True, min_channels: int = 512,
                        latent_channels: Union[int, float] = 0.25, min_features: int = 512,
                        latent_features: Union[int, float] = 0.25,
                        optimizers: Optional[Optimizers] = None) -> nn.Module:
    """Replace ``Conv2d`` / ``Linear`` layers of ``model`` with factorized pairs, in place.

    A ``Conv2d`` is replaced when ``groups == 1``, ``min(in_channels, out_channels) >=
    min_channels`` and ``latent_channels`` lowers its multiply-adds; a ``Linear`` when
    ``min(in_features, out_features) >= min_features`` and ``latent_features`` lowers its
    multiply-adds (:func:`factorizing_could_speedup`). Layers inside factorized modules are
    never factorized again.

    Args:
        model: the model to modify (not yet wrapped or sharded).
        factorize_convs: factorize ``Conv2d`` layers; default True.
        factorize_linears: factorize ``Linear`` layers; default True.
        min_channels: the narrowest conv replaced; default 512.
        latent_channels: the latent channels: an int, or a fraction (< 1) of
            ``min(in_channels, out_channels)``; default 0.25.
        min_features: the narrowest linear replaced; default 512.
        latent_features: the latent features: an int, or a fraction (< 1) of
            ``min(in_features, out_features)``; default 0.25.
        optimizers: optimizers built on ``model.parameters()``: the factors join the group
            of the layer they replace. Not needed if built after.

    Returns:
        ``model``.

    Raises:
        ValueError: a negative minimum or a non-positive latent size.
        TypeError: ``model`` is already parallelized (DDP / FSDP).
    """
    _check_min("min_channels", min_channels)
    _check_min("min_features", min_features)
    _check_latent("latent_channels", latent_channels)
    _check_latent("latent_features", latent_features)

    def maybe_conv(module: nn.Module, module_index: int) -> Optional[nn.Module]:
        conv: nn.Conv2d = module  # type: ignore[assignment]
        if getattr(conv, "_already_factorized", False):
            return None
        wide = min(conv.in_channels, conv.out_channels) >= min_channels
        if wide and factorizing_could_speedup(conv, latent_channels):
            return FactorizedConv2d.from_conv2d(conv, module_index,
                                                latent_channels=latent_channels)
        return None

    def maybe_linear(module: nn.Module, module_index: int) -> Optional[nn.Module]:
        linear: nn.Linear = module  # type: ignore[assignment]
        if getattr(linear, "_already_factorized", False):
            return None
        wide = min(linear.in_features, linear.out_features) >= min_features
        if wide and factorizing_could_speedup(linear, latent_features):
            return FactorizedLinear.from_linear(linear, module_index,
                                                latent_features=latent_features)
        return None

    if factorize_convs:
        module_surgery.replace_module_classes(model, {nn.Conv2d: maybe_conv},
                                              optimizers=optimizers)
    if factorize_linears:
        module_surgery.replace_module_classes(model, {nn.Linear: maybe_linear},
                                              optimizers=optimizers)
    log.info("Applied factorization to %s: %d FactorizedConv2d, %d FactorizedLinear.",
             type(model).__name__,
             module_surgery.count_module_instances(model, FactorizedConv2d),
             module_surgery.count_module_instances(model, FactorizedLinear))
    return model


@algorithms.register("factorize")
class Factorize(InitSurgery):
    """Low-rank factorization of ``Conv2d`` and ``Linear`` layers at ``Event.INIT`` (see
    :func:`apply_factorization`): a conv ``[N, C_in, H, W] -> [N, C_out, H', W']`` becomes a
    ``k x k`` conv to ``latent_channels`` then a ``1 x 1`` conv; a linear ``[..., in] ->
    [..., out]`` becomes ``in -> latent_features -> out``. Only layers at least
    ``min_channels`` / ``min_features`` wide whose factorization lowers their
    multiply-adds are replaced (for a linear or ``1 x 1`` conv, a latent size below about
    half the smaller side).

    Args:
        factorize_convs: factorize ``Conv2d`` layers; default True.
        factorize_linears: factorize ``Linear`` layers; default True.
        min_channels: the narrowest conv replaced; default 256.
        latent_channels: an int, or a fraction (< 1) of ``min(in, out)`` channels; default
            0.25.
        min_features: the narrowest linear replaced; default 256.
        latent_features: an int, or a fraction (< 1) of ``min(in, out)`` features; default
            128.

    Raises:
        ValueError: a negative minimum or a non-positive latent size.

    Logs the hyperparameters ``factorize/num_conv2d_replacements`` and
    ``factorize/num_linear_replacements``.

    Example (YAML)::

        algorithms:
          factorize: {min_channels: 128, latent_channels: 0.25}
    """

    def __init__(self, factorize_convs: bool = True, factorize_linears: bool = True,
                 min_channels: int = 256, latent_channels: Union[int, float] = 0.25,
                 min_features: int = 256, latent_features: Union[int, float] = 128) -> None:
        _check_min("min_channels", min_channels)
        _check_min("min_features", min_features)
        _check_latent("latent_channels", latent_channels)
        _check_latent("latent_features", latent_features)
        self.factorize_convs = factorize_convs
        self.factorize_linears = factorize_linears
        self.min_channels = min_channels
        self.latent_channels = latent_channels
        self.min_features = min_features
        self.latent_features = latent_features

    def __repr__(self) -> str:
        return (f"Factorize(factorize_convs={self.factorize_convs}, factorize_linears="
                f"{self.factorize_linears}, min_channels={self.min_channels}, latent_channels="
                f"{self.latent_channels}, min_features={self.min_features}, latent_features="
                f"{self.latent_features})")

    def apply(self, event: Event, state: State, logger: Any) -> None:
        apply_factorization(state.model, factorize_convs=self.factorize_convs,
                            factorize_linears=self.factorize_linears,
                            min_channels=self.min_channels, latent_channels=self.latent_channels,
                            min_features=self.min_features, latent_features=self.latent_features,
                            optimizers=state.optimizers)
        if self.factorize_convs:
            logger.log_hyperparameters({LOG_NUM_CONV2D_REPLACEMENTS_KEY:
                module_surgery.count_module_instances(state.model, FactorizedConv2d)})
        if self.factorize_linears:
            logger.log_hyperparameters({LOG_NUM_LINEAR_REPLACEMENTS_KEY:
                module_surgery.count_module_instances(state.model, FactorizedLinear)})
