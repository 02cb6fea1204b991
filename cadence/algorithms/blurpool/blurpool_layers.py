"""BlurPool's layers and functions: ``blur_2d``, ``blurmax_pool2d``, ``BlurMaxPool2d``,
``BlurConv2d``, ``BlurPool2d`` (Composer's ``composer/algorithms/blurpool/blurpool_layers.py``;
Zhang, ICML 2019)."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.common_types import _size_2_t

__all__ = ['BlurConv2d', 'BlurMaxPool2d', 'BlurPool2d', 'blur_2d', 'blurmax_pool2d']


def _default_filter() -> torch.Tensor:
    """The binomial 3x3 low-pass filter ``[1, 2, 1]^T [1, 2, 1] / 16``, shape ``[1, 1, 3, 3]``."""
    row = torch.tensor([1.0, 2.0, 1.0])
    return (torch.outer(row, row) / 16.0).reshape(1, 1, 3, 3)


def _pair(value: _size_2_t) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


def blur_2d(input: torch.Tensor, stride: _size_2_t = 1,
            filter: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Low-pass filter each channel of ``input`` separately ("same" zero padding), then
    subsample by ``stride``.

    Args:
        input: ``[N, C, H, W]``.
        stride: the subsampling stride along H and W (an int or a pair); default 1.
        filter: ``[kH, kW]``, ``[1, 1, kH, kW]`` (shared by every channel) or
            ``[C, 1, kH, kW]`` (one per channel), odd ``kH`` and ``kW``; default the 3x3
            binomial filter ``[[1, 2, 1], [2, 4, 2], [1, 2, 1]] / 16``.

    Returns:
        ``[N, C, ceil(H / sH), ceil(W / sW)]`` (for the 3x3 filter); ``input`` itself when
        it is too small for the filter even with padding.

    Raises:
        ValueError: ``input`` is not 4-D, or the filter has an even side or the wrong shape.
    """
    if input.ndim != 4:
        raise ValueError(f"blur_2d: input must be [N, C, H, W], got shape {tuple(input.shape)}.")
    channels, height, width = input.shape[1:]
    if filter is None:
        filter = _default_filter()
    if filter.ndim == 2:
        filter = filter[None, None]
    if filter.ndim != 4 or filter.shape[1] != 1 or filter.shape[0] not in (1, channels):
        raise ValueError(f"blur_2d: filter must be [kH, kW], [1, 1, kH, kW] or [{channels}, 1, "
                         f"kH, kW], got shape {tuple(filter.shape)}.")
    k_h, k_w = filter.shape[2:]
    if k_h % 2 == 0 or k_w % 2 == 0:
        raise ValueError(f"blur_2d: the filter's height and width must be odd, got {k_h}x{k_w}.")
    pad = (k_h // 2, k_w // 2)
    if height + 2 * pad[0] < k_h or width + 2 * pad[1] < k_w:
        return input
    filter = filter.to(dtype=input.dtype, device=input.device)
    if filter.shape[0] != channels:
        filter = filter.expand(channels, 1, k_h, k_w)
    return F.conv2d(input, filter, stride=stride, padding=pad, groups=channels)


def blurmax_pool2d(input: torch.Tensor, kernel_size: Optional[_size_2_t] = None,
                   stride: _size_2_t = 2, padding: _size_2_t = 0, dilation: _size_2_t = 1,
                   ceil_mode: bool = False, filter: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Anti-aliased max-pooling (Zhang 2019, "MaxBlurPool"): the max over each
    ``kernel_size`` window at stride 1, then :func:`blur_2d` with ``stride``.

    A drop-in for :func:`torch.nn.functional.max_pool2d` without ``return_indices`` (indices
    mean nothing after blurring).

    Args:
        input: ``[N, C, H, W]``.
        kernel_size: the max window; default ``(2, 2)``.
        stride: the subsampling stride, applied by the blur; default 2.
        padding, dilation, ceil_mode: as in ``max_pool2d`` (of the stride-1 max).
        filter: the blur filter (see :func:`blur_2d`).

    Returns:
        ``[N, C, H', W']``, with ``H' = ceil((H - d (k - 1) - 1 + 2 p + 1) / stride)`` for
        the default filter.
    """
    maxes = F.max_pool2d(input, kernel_size=(2, 2) if kernel_size is None else kernel_size,
                         stride=1, padding=padding, dilation=dilation, ceil_mode=ceil_mode)
    return blur_2d(maxes, stride=stride, filter=filter)


class BlurMaxPool2d(nn.Module):
    """:class:`torch.nn.MaxPool2d` with anti-aliasing (:func:`blurmax_pool2d`):
    ``[N, C, H, W] -> [N, C, H', W']``. Same arguments as ``MaxPool2d`` except
    ``return_indices``; ``stride`` defaults to ``kernel_size``. The filter is a
    non-persistent buffer (moves with ``.to()``, not in the ``state_dict``)."""

    def __init__(self, kernel_size: _size_2_t, stride: Optional[_size_2_t] = None,
                 padding: _size_2_t = 0, dilation: _size_2_t = 1, ceil_mode: bool = False) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = kernel_size if stride is None else stride
        self.padding = padding
        self.dilation = dilation
        self.ceil_mode = ceil_mode
        self.register_buffer("filt2d", _default_filter(), persistent=False)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return blurmax_pool2d(input, kernel_size=self.kernel_size, stride=self.stride,
                              padding=self.padding, dilation=self.dilation,
                              ceil_mode=self.ceil_mode, filter=self.filt2d)

    @staticmethod
    def from_maxpool2d(module: nn.MaxPool2d, module_index: int = -1) -> BlurMaxPool2d:
        """The anti-aliased twin of ``module`` (a surgery policy; ``module_index`` unused)."""
        del module_index
        return BlurMaxPool2d(kernel_size=module.kernel_size, stride=module.stride,
                             padding=module.padding, dilation=module.dilation,
                             ceil_mode=module.ceil_mode)


class BlurConv2d(nn.Module):
    """:class:`torch.nn.Conv2d` with an anti-aliasing blur: ``[N, C_in, H, W] ->
    [N, C_out, H', W']`` (the shapes of the plain strided conv, for odd kernels with
    "same"-style padding).

    ``blur_first=True`` (default): blur the input (stride 1), then the strided conv; about
    the cost of the conv alone. ``blur_first=False``: the conv at stride 1, then blur and
    subsample by the stride (the paper's order, ``stride_h * stride_w`` times the conv's
    work). The conv is ``self.conv``; the filter a non-persistent buffer ``blur_filter``.

    Args:
        in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias: as
            in ``Conv2d`` (``stride`` defaults to ``kernel_size`` with ``blur_first=False``
            and is required with ``blur_first=True``).
        blur_first: blur before (True) or after (False) the convolution.

    Raises:
        ValueError: ``blur_first=True`` without a ``stride``.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: _size_2_t,
                 stride: Optional[_size_2_t] = None, padding: _size_2_t = 0,
                 dilation: _size_2_t = 1, groups: int = 1, bias: bool = True,
                 blur_first: bool = True) -> None:
        super().__init__()
        self.blur_first = blur_first
        if blur_first:
            if stride is None:
                raise ValueError("BlurConv2d: blur_first=True needs a stride (the conv's).")
            conv_stride, self.blur_stride, blur_channels = stride, 1, in_channels
        else:
            conv_stride, blur_channels = 1, out_channels
            self.blur_stride = kernel_size if stride is None else stride
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=conv_stride,
                              padding=padding, dilation=dilation, groups=groups, bias=bias)
        self.conv._already_blurpooled = True  # type: ignore[assignment]  # not blurred twice
        self.register_buffer("blur_filter", _default_filter().repeat(blur_channels, 1, 1, 1),
                             persistent=False)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if self.blur_first:
            return self.conv(blur_2d(input, stride=self.blur_stride, filter=self.blur_filter))
        return blur_2d(self.conv(input), stride=self.blur_stride, filter=self.blur_filter)

    @staticmethod
    def from_conv2d(module: nn.Conv2d, module_index: int = -1,
                    blur_first: bool = True) -> BlurConv2d:
        """A :class:`BlurConv2d` that trains ``module``'s own weight and bias (the same
        ``Parameter`` objects, so optimizers built on them keep training them)."""
        del module_index
        blurconv = BlurConv2d(module.in_channels, module.out_channels, module.kernel_size,
                              stride=module.stride, padding=module.padding,
                              dilation=module.dilation, groups=module.groups,
                              bias=module.bias is not None, blur_first=blur_first)
        blurconv.conv.weight = module.weight
        if module.bias is not None:
            blurconv.conv.bias = module.bias
        blurconv.conv.padding_mode = module.padding_mode
        return blurconv.to(module.weight.device)


class BlurPool2d(nn.Module):
    """:func:`blur_2d` as a module: ``[N, C, H, W] -> [N, C, ceil(H / s), ceil(W / s)]``.

    Args:
        stride: the subsampling stride; default 2.
        padding: kept for Composer's signature; the blur always pads to "same" (1 for the
            3x3 filter).
    """

    def __init__(self, stride: _size_2_t = 2, padding: _size_2_t = 1) -> None:
        super().__init__()
        self.stride = stride
        self.padding = padding
        self.register_buffer("filt2d", _default_filter(), persistent=False)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return blur_2d(input, stride=self.stride, filter=self.filt2d)
