"""Low-rank factorization of linear maps: the solvers and the factorized modules.

A ``Linear`` weight ``W [out, in]`` becomes two smaller linear maps applied in sequence
(``in -> rank -> out``, no nonlinearity between); a ``Conv2d`` becomes a ``k x k`` conv to
``rank`` channels followed by a ``1 x 1`` conv to the output channels. That costs fewer
multiply-adds whenever ``rank`` is below ``fan_in * out / (fan_in + out)``.

Solvers: :func:`factorize_matrix` minimizes the output error ``||X W_a W_b + b - Y||_F`` on
sample inputs ``X`` by alternating least squares from a truncated-SVD start;
:func:`factorize_conv2d` does the same for convolutions on unfolded input patches.
Modules: :class:`FactorizedLinear`, :class:`FactorizedConv2d`, built from an existing layer
(``from_linear`` / ``from_conv2d``, initialized with the layer's best rank-``r`` weight
approximation) and re-factorizable to a lower rank on sample inputs (``set_rank``).

Source: the API of MosaicML Composer's ``composer/algorithms/factorize/factorize_core.py``
and ``factorize_modules.py`` (names, arguments, defaults, ``LowRankSolution``); the method
is the classic reduced-rank regression / alternating least squares (e.g. Zhang et al.,
"Accelerating Very Deep Convolutional Networks for Classification and Detection", TPAMI
2016, https://arxiv.org/abs/1505.06798).
"""

from __future__ import annotations

import abc
import dataclasses
import math
from typing import Any, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.common_types import _size_2_t

from cadence.algorithms.factorize.factorize_core import (
    LowRankSolution, _svd_split, factorize_conv2d, factorize_matrix,
)

__all__ = ["FactorizedConv2d", "FactorizedLinear", "factorizing_could_speedup"]


def _clean_latent_size(latent_size: Union[int, float], in_size: int, out_size: int) -> int:
    """An absolute latent width (``>= 1``), or a fraction (< 1) of ``min(in, out)``, at
    least 1."""
    if latent_size <= 0:
        raise ValueError(f"the latent size must be > 0 (a width, or a fraction below 1), got "
                         f"{latent_size}.")
    if latent_size < 1:
        return max(1, int(latent_size * min(in_size, out_size)))
    return int(latent_size)


def _max_rank_with_possible_speedup(in_channels: int, out_channels: int,
                                    kernel_size: Optional[_size_2_t] = None) -> int:
    """The largest latent width whose two maps cost fewer multiply-adds than the one:
    ``r * (fan_in + out) < fan_in * out``, ``fan_in = in * kH * kW``."""
    fan_in = in_channels
    if kernel_size is not None:
        kh, kw = (kernel_size, kernel_size) if isinstance(kernel_size, int) else kernel_size
        fan_in *= kh * kw
    breakeven = fan_in * out_channels / (fan_in + out_channels)
    return int(math.ceil(breakeven - 1))


def factorizing_could_speedup(module: nn.Module, latent_size: Union[int, float]) -> bool:
    """Whether factorizing ``module`` (a ``Conv2d``, ``Linear`` or factorized module) to
    ``latent_size`` (an int, or a fraction < 1 of ``min(in, out)``) lowers its multiply-adds
    (a necessary, not a sufficient, condition for a wall-clock speedup). False for grouped
    convs and other module types."""
    if isinstance(module, _FactorizedModule):
        return module.should_factorize(latent_size)
    if isinstance(module, nn.Conv2d):
        if module.groups > 1:
            return False
        size = _clean_latent_size(latent_size, module.in_channels, module.out_channels)
        return size <= _max_rank_with_possible_speedup(module.in_channels, module.out_channels,
                                                       module.kernel_size)  # type: ignore
    if isinstance(module, nn.Linear):
        size = _clean_latent_size(latent_size, module.in_features, module.out_features)
        return size <= _max_rank_with_possible_speedup(module.in_features, module.out_features)
    return False


class _FactorizedModule(nn.Module, abc.ABC):
    """Two maps in sequence, ``module0`` (to ``latent_size``) then ``module1``."""

    module0: nn.Module
    module1: nn.Module

    def __init__(self, in_size: int, out_size: int, latent_size: Union[int, float],
                 kernel_size: _size_2_t = 1) -> None:
        super().__init__()
        self.in_size = in_size
        self.out_size = out_size
        self.latent_size = _clean_latent_size(latent_size, in_size, out_size)
        self.kernel_size = kernel_size

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self.module1(self.module0(input))

    def reset_parameters(self) -> None:
        """Re-initialize both maps as ``torch.nn`` does."""
        self.module0.reset_parameters()  # type: ignore[operator]
        self.module1.reset_parameters()  # type: ignore[operator]

    def _max_rank_with_speedup(self) -> int:
        if hasattr(self, "module1"):  # already factorized: any lower rank helps
            return self.latent_size - 1
        return _max_rank_with_possible_speedup(self.in_size, self.out_size, self.kernel_size)

    def should_factorize(self, proposed_rank: Union[int, float]) -> bool:
        """Whether ``proposed_rank`` would lower the multiply-adds."""
        size = _clean_latent_size(proposed_rank, self.in_size, self.out_size)
        return size <= self._max_rank_with_speedup()

    def _check_latent(self, name: str) -> None:
        most = _max_rank_with_possible_speedup(self.in_size, self.out_size, self.kernel_size)
        if self.latent_size > most:
            raise ValueError(
                f"{name}={self.latent_size} is too large for factorization to save work "
                f"(in {self.in_size}, out {self.out_size}); use at most {most}.")

    def set_rank(self, input: torch.Tensor, rank: int) -> None:
        """Re-factorize to ``rank`` latent dims, fitted to this module's outputs on ``input``
        (new ``Parameter`` objects: rebuild or update optimizers afterwards).

        Raises:
            ValueError: ``rank`` above the current latent size.
        """
        if rank > self.latent_size:
            raise ValueError(f"set_rank: rank {rank} exceeds the current rank "
                             f"{self.latent_size}; ranks can only go down.")
        if rank < self.latent_size:
            self.apply_solution(self.solution_for_rank(input, rank))

    @abc.abstractmethod
    def solution_for_rank(self, input: torch.Tensor, rank: int) -> LowRankSolution:
        """A rank-``rank`` :class:`LowRankSolution` fitted on ``input`` (not applied)."""

    @abc.abstractmethod
    def apply_solution(self, solution: LowRankSolution) -> None:
        """Set both maps from ``solution`` (always; no check that it is worthwhile)."""

    def _set_factors(self, solution: LowRankSolution, wa: torch.Tensor, wb: torch.Tensor
                     ) -> None:
        if solution.rank < 1 or solution.bias is None:
            raise ValueError("apply_solution needs a factorized solution (rank >= 1, a bias).")
        ref = self.module1.weight  # type: ignore[union-attr]
        like = {"device": ref.device, "dtype": ref.dtype}
        self.latent_size = solution.rank
        self.module0.weight = nn.Parameter(wa.to(**like))  # type: ignore[union-attr]
        self.module0.bias = None  # type: ignore[union-attr]  # no expressivity added
        self.module1.weight = nn.Parameter(wb.to(**like))  # type: ignore[union-attr]
        self.module1.bias = nn.Parameter(solution.bias.to(**like))  # type: ignore[union-attr]


def _mark(*modules: nn.Module) -> None:
    for module in modules:
        module._already_factorized = True  # type: ignore[assignment]  # factorized once


class FactorizedConv2d(_FactorizedModule):
    """A ``Conv2d`` as two: ``module0`` (``kH x kW``, ``C_in -> latent``, the original
    stride/padding/dilation, no bias) then ``module1`` (``1 x 1``, ``latent -> C_out``, with
    bias): ``[N, C_in, H, W] -> [N, latent, H', W'] -> [N, C_out, H', W']``.

    Args:
        in_channels, out_channels, kernel_size: as ``Conv2d``.
        latent_channels: the latent width: an int, or a fraction (< 1) of
            ``min(in_channels, out_channels)`` (at least 1); default 0.25.
        **kwargs: other ``Conv2d`` arguments for ``module0`` (``stride``, ``padding``,
            ``dilation``, ``padding_mode``; ``bias`` is ignored, ``module1`` has one).

    Raises:
        ValueError: ``latent_channels`` too large to save multiply-adds (at most
            :meth:`max_allowed_latent_channels`).
        NotImplementedError: ``groups > 1``.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: _size_2_t,
                 latent_channels: Union[int, float] = 0.25, **kwargs: Any) -> None:
        super().__init__(in_channels, out_channels, latent_channels, kernel_size)
        if kwargs.get("groups", 1) > 1:
            raise NotImplementedError("FactorizedConv2d: grouped convolutions are not supported.")
        self._check_latent("latent_channels")
        self.kwargs = kwargs
        self.convolution_kwargs = {k: v for k, v in kwargs.items() if k != "bias"}
        self.module0 = nn.Conv2d(in_channels, self.latent_size, kernel_size, bias=False,
                                 **self.convolution_kwargs)
        self.module1 = nn.Conv2d(self.latent_size, out_channels, kernel_size=1, bias=True)
        _mark(self.module0, self.module1)

    @property
    def in_channels(self) -> int:
        return self.in_size

    @property
    def out_channels(self) -> int:
        return self.out_size

    @property
    def latent_channels(self) -> int:
        """``module0``'s output channels."""
        return self.latent_size

    @staticmethod
    def max_allowed_latent_channels(in_channels: int, out_channels: int,
                                    kernel_size: _size_2_t) -> int:
        """The largest latent width that lowers the multiply-adds."""
        return _max_rank_with_possible_speedup(in_channels, out_channels, kernel_size)

    max_allowed_latent_features = max_allowed_latent_channels  # Composer's name for it

    def solution_for_rank(self, input: torch.Tensor, rank: int) -> LowRankSolution:
        return factorize_conv2d(input, self.module0.weight, self.module1.weight, rank=rank,
                                biasA=self.module0.bias, biasB=self.module1.bias,
                                **self.convolution_kwargs)

    def apply_solution(self, solution: LowRankSolution) -> None:
        assert solution.Wa is not None and solution.Wb is not None
        self._set_factors(solution, solution.Wa, solution.Wb)
        self.module0.out_channels = solution.rank
        self.module1.in_channels = solution.rank

    @staticmethod
    def from_conv2d(module: nn.Conv2d, module_ix: int = -1, **kwargs: Any) -> FactorizedConv2d:
        """A factorized twin of ``module`` (``kwargs``: ``latent_channels``), initialized with
        the best rank-``latent`` approximation of its weight (truncated SVD of
        ``[C_out, C_in * kH * kW]``) and its bias, on its device and dtype."""
        del module_ix
        conv = FactorizedConv2d(module.in_channels, module.out_channels, module.kernel_size,
                                stride=module.stride, padding=module.padding,
                                dilation=module.dilation, groups=module.groups,
                                padding_mode=module.padding_mode,
                                bias=module.bias is not None, **kwargs)
        weight = module.weight.detach().float()
        b, a = _svd_split(weight.reshape(weight.shape[0], -1), conv.latent_size)
        bias = (module.bias.detach().float() if module.bias is not None
                else torch.zeros(module.out_channels))
        conv.apply_solution(LowRankSolution(Wa=a.reshape(conv.latent_size, *weight.shape[1:]),
                                            Wb=b.reshape(*b.shape, 1, 1), bias=bias,
                                            rank=conv.latent_size))
        return conv.to(device=module.weight.device, dtype=module.weight.dtype)


class FactorizedLinear(_FactorizedModule):
    """A ``Linear`` as two: ``module0`` (``in -> latent``, no bias) then ``module1``
    (``latent -> out``, with the original's bias): ``[..., in] -> [..., latent] -> [..., out]``.

    Args:
        in_features, out_features: as ``Linear``.
        bias: whether ``module1`` has a bias; default True.
        latent_features: the latent width: an int, or a fraction (< 1) of
            ``min(in_features, out_features)`` (at least 1); default 0.25.

    Raises:
        ValueError: ``latent_features`` too large to save multiply-adds (at most
            :meth:`max_allowed_latent_features`, about half the smaller side).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 latent_features: Union[int, float] = 0.25) -> None:
        super().__init__(in_features, out_features, latent_features)
        self._check_latent("latent_features")
        self.bias = bias
        self.module0 = nn.Linear(in_features, self.latent_size, bias=False)
        self.module1 = nn.Linear(self.latent_size, out_features, bias=bias)
        _mark(self.module0, self.module1)

    @property
    def in_features(self) -> int:
        return self.in_size

    @property
    def out_features(self) -> int:
        return self.out_size

    @property
    def latent_features(self) -> int:
        """``module0``'s output features."""
        return self.latent_size

    @staticmethod
    def max_allowed_latent_features(in_features: int, out_features: int) -> int:
        """The largest latent width that lowers the multiply-adds."""
        return _max_rank_with_possible_speedup(in_features, out_features)

    max_allowed_latent_channels = max_allowed_latent_features  # Composer's name for it

    def solution_for_rank(self, input: torch.Tensor, rank: int) -> LowRankSolution:
        with torch.no_grad():
            target = self(input)
        bias = self.module1.bias
        return factorize_matrix(input.reshape(-1, self.in_size), target.reshape(-1, self.out_size),
                                self.module0.weight.T, self.module1.weight.T,
                                bias=bias, rank=rank)

    def apply_solution(self, solution: LowRankSolution) -> None:
        assert solution.Wa is not None and solution.Wb is not None
        if solution.bias is None:
            solution.bias = torch.zeros(self.out_size)
        self._set_factors(solution, solution.Wa.T, solution.Wb.T)
        if not self.bias:
            self.module1.bias = None
        self.module0.out_features = solution.rank
        self.module1.in_features = solution.rank

    @staticmethod
    def from_linear(module: nn.Linear, module_ix: int = -1, **kwargs: Any) -> FactorizedLinear:
        """A factorized twin of ``module`` (``kwargs``: ``latent_features``), initialized
        with the best rank-``latent`` approximation of its weight (truncated SVD) and its
        bias, on its device and dtype."""
        del module_ix
        linear = FactorizedLinear(module.in_features, module.out_features,
                                  bias=module.bias is not None, **kwargs)
        weight = module.weight.detach().float()  # [out, in]
        b, a = _svd_split(weight, linear.latent_size)  # [out, r], [r, in]
        bias = (module.bias.detach().float() if module.bias is not None
                else torch.zeros(module.out_features))
        linear.apply_solution(LowRankSolution(Wa=a.T, Wb=b.T, bias=bias,
                                              rank=linear.latent_size))
        return linear.to(device=module.weight.device, dtype=module.weight.dtype)
