"""Numeric precision of a run: ``fp32``, ``amp_bf16`` or ``amp_fp16``.

``amp_*`` runs the forward pass under :func:`torch.autocast` (parameters stay fp32; matmuls
run in the low precision). Source: Composer's ``Precision`` and PyTorch AMP
(https://pytorch.org/docs/stable/amp.html).
"""

from __future__ import annotations

import contextlib
from enum import Enum
from typing import TYPE_CHECKING, ContextManager

if TYPE_CHECKING:  # imported where used: the run-file check reads Precision without torch
    import torch

__all__ = ["Precision", "get_precision_context"]


class Precision(str, Enum):
    """Run precision. ``amp_fp16`` also uses a gradient scaler (see the Trainer)."""

    FP32 = "fp32"
    AMP_BF16 = "amp_bf16"
    AMP_FP16 = "amp_fp16"

    @classmethod
    def parse(cls, value: str | Precision) -> Precision:
        """``value`` as a Precision.

        Raises:
            ValueError: naming the value and the allowed ones.
        """
        try:
            return cls(value)
        except ValueError:
            allowed = ", ".join(p.value for p in cls)
            raise ValueError(f"precision {value!r} is not one of: {allowed}.") from None


def get_precision_context(precision: Precision, device: torch.device) -> ContextManager[None]:
    """The autocast context for ``precision`` on ``device`` (a no-op for fp32)."""
    if precision == Precision.FP32:
        return contextlib.nullcontext()
    import torch

    dtype = torch.bfloat16 if precision == Precision.AMP_BF16 else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)
