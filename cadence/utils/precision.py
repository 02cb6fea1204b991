"""Which low-precision formats a device runs natively.

Source: ``torch.cuda.is_bf16_supported`` (PyTorch); NCCL 2.10 release notes (the first NCCL
with bfloat16 reductions).
"""

from __future__ import annotations

from typing import Optional, Union

import torch

__all__ = ["bf16_supported", "check_precision", "MIN_NCCL_FOR_BF16"]

MIN_NCCL_FOR_BF16 = (2, 10)
"""The first NCCL version whose collectives take bfloat16 tensors."""


def bf16_supported(device: Optional[Union[str, torch.device]] = None) -> bool:
    """Whether ``device`` runs bfloat16 natively, so ``amp_bf16`` is worth using there.

    - CUDA: the GPU computes in bf16 without emulation
      (``torch.cuda.is_bf16_supported(including_emulation=False)``: compute capability 8.0+,
      Ampere and later) and the NCCL that torch was built with is at least 2.10 (older NCCL
      cannot all-reduce bf16 gradients). False when CUDA is not available.
    - CPU: True. Every CPU runs bf16 correctly (often slowly: on CPUs without AVX-512-BF16 or
      AMX a bf16 matmul is ~70x slower than fp32).

    Args:
        device: the device to ask about; ``None`` asks about CUDA when it is available,
            else the CPU.

    Returns:
        True when bf16 mixed precision is natively supported.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    kind = torch.device(device).type
    if kind == "cpu":
        return True
    if kind != "cuda":
        return False
    if not torch.cuda.is_available():
        return False
    if not torch.cuda.is_bf16_supported(including_emulation=False):
        return False
    return _nccl_version() >= MIN_NCCL_FOR_BF16


def _nccl_version() -> tuple[int, ...]:
    """The NCCL version torch was built with, as a tuple; ``(0,)`` without NCCL."""
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return (0,)
    if isinstance(version, int):  # very old torch: 2708 -> (2, 7, 8)
        return (version // 1000, version // 100 % 10, version % 100)
    return tuple(version)


def check_precision(precision: object, device: Union[str, torch.device]) -> None:
    """Refuse ``amp_bf16`` on a device without native bf16 (:func:`bf16_supported`): a CUDA
    GPU older than Ampere, or a torch built with NCCL < 2.10. The CPU always passes (torch
    runs bf16 autocast on every CPU, if slowly); so do ``fp32`` and ``amp_fp16``.

    Args:
        precision: the run's precision (``"amp_bf16"`` or a ``Precision``).
        device: the run's device.

    Raises:
        ValueError: naming the precision, the device and what to use instead.
    """
    if str(getattr(precision, "value", precision)) != "amp_bf16" or bf16_supported(device):
        return
    raise ValueError(
        f"precision='amp_bf16' is not natively supported on {device}: bf16 needs an Ampere or "
        f"newer GPU (compute capability 8.0+) and NCCL >= 2.10 (torch.cuda.is_bf16_supported"
        f"(including_emulation=False) is {_cuda_bf16()}, NCCL {_nccl_version()}). Use "
        f"precision='amp_fp16' (with its gradient scaler) or 'fp32'.")


def _cuda_bf16() -> bool:
    try:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except (AssertionError, RuntimeError):  # no CUDA at all
        return False
