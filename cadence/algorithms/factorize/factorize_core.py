"""Low-rank solvers: ``factorize_matrix``, ``factorize_conv2d`` and their ``LowRankSolution``
(Composer's ``composer/algorithms/factorize/factorize_core.py``; alternating least squares
from a truncated-SVD start, see :mod:`.factorize_modules`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Union

import torch
import torch.nn.functional as F
from torch.nn.common_types import _size_2_t

__all__ = ['LowRankSolution', 'factorize_conv2d', 'factorize_matrix']


@dataclasses.dataclass
class LowRankSolution:
    """A factorized linear map.

    Attributes:
        Wa: the first map: ``[D, rank]`` for a matrix; ``[rank, C_in, kH, kW]`` for a conv.
            With ``rank == -1`` (no factorization), the single full map ``[D, M]``.
        Wb: the second map: ``[rank, M]`` for a matrix; ``[C_out, rank, 1, 1]`` for a conv;
            None when not factorized.
        bias: ``[M]``, added after the second map.
        rank: the latent width, or -1 when the map was not factorized.
        nmse: the output's mean squared error over the outputs' variance on the sample
            inputs (0 is exact; 1 is no better than predicting the mean).
    """

    Wa: Optional[torch.Tensor] = None
    Wb: Optional[torch.Tensor] = None
    bias: Optional[torch.Tensor] = None
    rank: int = -1
    nmse: float = 0.0


def _lstsq(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``argmin_X ||a X - b||_F`` for ``a [n, d]``, ``b [n, m]`` (minimum-norm when ``a`` is
    rank-deficient)."""
    return torch.linalg.pinv(a) @ b


def _svd_split(weight: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The best rank-``rank`` approximation (Eckart-Young) of ``weight [D, M]`` as
    ``(A [D, rank], B [rank, M])`` with the singular values split evenly between them."""
    u, s, vh = torch.linalg.svd(weight, full_matrices=False)
    root = s[:rank].sqrt()
    return u[:, :rank] * root, root[:, None] * vh[:rank]


def _nmse(target: torch.Tensor, estimate: torch.Tensor) -> float:
    variance = target.var()
    if variance == 0:
        return 0.0 if torch.equal(target, estimate) else float("inf")
    return float(((target - estimate) ** 2).mean() / variance)


def factorize_matrix(X: torch.Tensor, Y: torch.Tensor, Wa: torch.Tensor,
                     Wb: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                     rank: Union[int, float] = 0.25, n_iters: int = 3) -> LowRankSolution:
    """Factorize the map ``W = Wa`` (or ``Wa @ Wb``) into rank-``rank`` factors that best
    reproduce its outputs on ``X``.

    Minimizes ``||X @ A @ B + b - Y||_F`` over ``A [D, rank]``, ``B [rank, M]``, ``b [M]``:
    starts from the truncated SVD of ``W``, then ``n_iters`` rounds of alternating least
    squares (``B`` given ``A``, then ``A`` given ``B``), then sets ``b`` to the mean
    residual (plus ``bias``).

    Args:
        X: sample inputs ``[N, D]``.
        Y: the original map's outputs on them ``[N, M]`` (``X @ W + bias``).
        Wa: ``W [D, M]``, or the first factor ``[D, d]`` of an already factorized map.
        Wb: the second factor ``[d, M]`` of an already factorized map, or None.
        bias: ``[M]``, included in ``Y``; default None.
        rank: the latent width: an int, or a fraction (< 1) of ``D`` (at most the current
            rank); default 0.25.
        n_iters: alternating least squares rounds; default 3.

    Returns:
        A :class:`LowRankSolution`. When ``rank >= D`` or ``rank >= M``, factorizing cannot
        help: ``Wa`` is the least-squares full map ``[D, M]`` (which reproduces ``Y`` exactly
        when it is linear in ``X``), ``Wb`` None and ``rank`` -1. When ``rank`` is not below
        the current rank ``d``, the factors come back unchanged with ``rank`` -1.

    Raises:
        ValueError: shapes that do not fit, or ``rank <= 0``.
    """
    X, Y, Wa = X.detach().float(), Y.detach().float(), Wa.detach().float()
    Wb = None if Wb is None else Wb.detach().float()
    if X.ndim != 2 or Y.ndim != 2 or X.shape[0] != Y.shape[0]:
        raise ValueError(f"factorize_matrix: X [N, D] and Y [N, M] must be matrices with the "
                         f"same rows, got {tuple(X.shape)} and {tuple(Y.shape)}.")
    if rank <= 0:
        raise ValueError(f"factorize_matrix: rank must be > 0, got {rank}.")
    if rank < 1:
        rank = min(int(rank * X.shape[1]), Wa.shape[1])
    k = max(int(rank), 1)
    solution = LowRankSolution()
    original_bias = None if bias is None else bias.detach().float()
    if original_bias is not None:
        Y = Y - original_bias
    solution.bias = original_bias
    if k >= X.shape[1] or k >= Y.shape[1]:
        solution.Wa = _lstsq(X, Y)
        solution.nmse = _nmse(Y, X @ solution.Wa)
        return solution
    if k >= Wa.shape[1]:
        solution.Wa, solution.Wb = Wa, Wb
        return solution
    A, B = _svd_split(Wa if Wb is None else Wa @ Wb, k)
    Y_full = _lstsq(X, Y)  # the unconstrained optimum [D, M]
    for _ in range(n_iters):
        B = _lstsq(X @ A, Y)
        # with X of full column rank, argmin_A ||X A B - Y|| = Y_full @ pinv(B)
        A = Y_full @ torch.linalg.pinv(B)
    Y_hat = X @ A @ B
    new_bias = (Y - Y_hat).mean(dim=0)
    solution.Wa, solution.Wb, solution.rank = A, B, k
    solution.nmse = _nmse(Y, Y_hat + new_bias)
    solution.bias = new_bias if original_bias is None else new_bias + original_bias
    return solution


def _patches(X: torch.Tensor, kernel_size: tuple[int, int], padding: Any = 0,
             dilation: Any = 1, padding_mode: str = "zeros") -> torch.Tensor:
    """Every ``kernel_size`` patch of ``X [N, C, H, W]`` at stride 1, as rows
    ``[N * positions, C * kH * kW]`` (the conv weight's flattening order)."""
    if padding_mode != "zeros" and padding != 0:
        pad = (padding, padding) * 2 if isinstance(padding, int) else (
            padding[1], padding[1], padding[0], padding[0])
        X, padding = F.pad(X, pad, mode=padding_mode), 0
    if isinstance(padding, str):
        raise NotImplementedError(f"factorize_conv2d: padding={padding!r} is not supported; "
                                  f"pass the padding as numbers.")
    cols = F.unfold(X, kernel_size, dilation=dilation, padding=padding)  # [N, C*k*k, L]
    return cols.transpose(1, 2).reshape(-1, cols.shape[1])


def factorize_conv2d(X: torch.Tensor, Wa: torch.Tensor, Wb: Optional[torch.Tensor] = None,
                     rank: Union[int, float] = 0.25, biasA: Optional[torch.Tensor] = None,
                     biasB: Optional[torch.Tensor] = None, n_iters: int = 3,
                     **conv2d_kwargs: Any) -> LowRankSolution:
    """Factorize a ``kH x kW`` convolution into a ``kH x kW`` conv to ``rank`` channels and a
    ``1 x 1`` conv back to the output channels, fitted on the inputs ``X``.

    The conv is a matrix on input patches, so this is :func:`factorize_matrix` on the
    stride-1 patches of ``X`` (stride does not change the per-patch map; every position is
    used as a sample).

    Args:
        X: sample inputs ``[N, C_in, H, W]``.
        Wa: the weight ``[C_out, C_in, kH, kW]``, or the first factor
            ``[d, C_in, kH, kW]`` of an already factorized conv.
        Wb: the second factor ``[C_out, d, 1, 1]``, or None.
        rank: the latent channels: an int, or a fraction (< 1) of ``C_in * kH * kW`` (at
            most the current rank); default 0.25.
        biasA: the first conv's bias (``[C_out]``, or ``[d]`` when factorized).
        biasB: the second conv's bias ``[C_out]`` (only with ``Wb``).
        n_iters: alternating least squares rounds; default 3.
        **conv2d_kwargs: the conv's ``padding``, ``dilation``, ``padding_mode`` (used to
            extract the patches), ``stride`` (ignored), ``groups`` (must be 1).

    Returns:
        A :class:`LowRankSolution` with ``Wa [rank, C_in, kH, kW]``, ``Wb [C_out, rank, 1,
        1]`` and ``bias [C_out]`` (or, with ``rank`` -1, the unfactorized weight as ``Wa``).

    Raises:
        RuntimeError: ``biasB`` without ``Wb``.
        NotImplementedError: ``groups != 1``, or a string ``padding``.
    """
    if conv2d_kwargs.get("groups", 1) != 1:
        raise NotImplementedError("factorize_conv2d: grouped convolutions are not supported.")
    if biasB is not None and Wb is None:
        raise RuntimeError("factorize_conv2d: biasB was given without Wb.")
    kernel = (int(Wa.shape[2]), int(Wa.shape[3]))
    X_mat = _patches(X.detach().float(), kernel, conv2d_kwargs.get("padding", 0),
                     conv2d_kwargs.get("dilation", 1), conv2d_kwargs.get("padding_mode", "zeros"))
    Wa_mat = Wa.detach().float().reshape(Wa.shape[0], -1).T  # [C_in*k*k, d or C_out]
    Y = X_mat @ Wa_mat
    if biasA is not None:
        Y = Y + biasA.detach().float()
    Wb_mat = None
    if Wb is not None:
        Wb_mat = Wb.detach().float().reshape(Wb.shape[0], -1).T  # [d, C_out]
        Y = Y @ Wb_mat
        if biasB is not None:
            Y = Y + biasB.detach().float()
    solution = factorize_matrix(X_mat, Y, Wa_mat, Wb_mat, rank=rank, n_iters=n_iters)
    assert solution.Wa is not None
    solution.Wa = solution.Wa.T.reshape(solution.Wa.shape[1], -1, *kernel)
    if solution.Wb is not None:
        solution.Wb = solution.Wb.T.reshape(solution.Wb.shape[1], -1, 1, 1)
    return solution
