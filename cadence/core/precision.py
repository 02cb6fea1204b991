"""Numeric precision of a run: ``fp32``, ``amp_bf16`` or ``amp_fp16``.

``amp_*`` runs the forward pass under :func:`torch.autocast` (parameters stay fp32; matmuls
run in the low precision). Source: Composer's ``Precision`` and PyTorch AMP
(https://pytorch.org/docs/stable/amp.html).
"""

from __future__ import annotations

import contextlib
from enum import Enum
from typing import TYPE_CHECKING, Any, ContextManager, Optional, Union

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


def get_precision_context(
    precision: Union[str, Precision],
    precision_config: Optional[dict[str, Any]] = None,
    fp8_autocast_enabled: bool = True,
    device: Union[str, torch.device, None] = None,
) -> ContextManager[None]:
    """The autocast context for ``precision`` (Composer's ``get_precision_context``): a no-op
    for ``fp32``, else :func:`torch.autocast` in bfloat16 or float16 on ``device``.

    Args:
        precision: a :class:`Precision` or its value (``"amp_bf16"``).
        precision_config: Composer's FP8 (TransformerEngine) settings. cadence has no FP8
            precision, so it must be ``None`` or empty.
        fp8_autocast_enabled: Composer's FP8 switch; accepted, and has no effect without FP8.
        device: where autocast applies; default CUDA when available, else the CPU (as
            Composer). The Trainer passes its own device.

    Raises:
        ValueError: an unknown ``precision``; a non-empty ``precision_config``.
    """
    precision = Precision.parse(precision)
    del fp8_autocast_enabled
    if precision_config:
        raise ValueError(f"precision_config {precision_config!r} configures FP8 "
                         f"(TransformerEngine), which cadence does not support; use "
                         f"precision='amp_bf16' and leave precision_config unset.")
    if precision == Precision.FP32:
        return contextlib.nullcontext()
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device_type = torch.device(device).type
    dtype = torch.bfloat16 if precision == Precision.AMP_BF16 else torch.float16
    return torch.autocast(device_type=device_type, dtype=dtype)
