"""Mixed precision as an algorithm: set the run's precision at ``INIT``.

What each precision does in a run (the Trainer reads ``state.precision`` after ``INIT``,
when it shards the model and builds the optimizer, and around every forward):

- ``fp32``: everything in float32.
- ``amp_bf16``: forward and loss under ``torch.autocast(dtype=bfloat16)``: matmuls and
  convolutions run in bf16 (autocast's op lists). On CUDA autocast runs norms, softmax and
  losses in fp32; on the CPU losses run in fp32 and norms in their input's dtype, which is
  fp32 on a residual stream (a bf16 matmul output added to an fp32 residual is fp32).
  Parameters, gradients and optimizer state stay fp32.
- ``amp_fp16``: the same with float16, plus a ``torch.amp.GradScaler``: the loss is scaled
  before backward and the gradients are unscaled before ``AFTER_TRAIN_BATCH`` (so clipping
  and child-tuning masks see true gradients); steps with inf/NaN gradients are skipped.

Under FSDP2 the precision also picks the ``MixedPrecisionPolicy``
(:func:`cadence.parallel.fsdp.mixed_precision_policy`, fsdp key
``mixed_precision``): ``DEFAULT`` all-gathers parameters in the low precision and
reduce-scatters gradients in fp32; ``PURE`` does both in the low precision; ``FULL`` keeps
fp32. Norm layers are their own FSDP units with an fp32 policy, so their weights and
arithmetic stay fp32 (their output is cast back to the low precision). The sharded
parameters FSDP2 keeps, the gradients it hands the optimizer and every checkpoint are
fp32 in all cases.

Source: Micikevicius et al., "Mixed Precision Training", ICLR 2018; PyTorch AMP and FSDP2
``MixedPrecisionPolicy``; Composer's ``precision`` argument.
"""

from __future__ import annotations

import logging
from typing import Any

from cadence.core import Algorithm, Event, State
from cadence.core.precision import Precision
from cadence.registry import algorithms
from cadence.utils.precision import bf16_supported

__all__ = ["MixedPrecision"]

log = logging.getLogger(__name__)


@algorithms.register("mixed_precision")
class MixedPrecision(Algorithm):
    """Set the run's precision (``amp_bf16``, ``amp_fp16`` or ``fp32``) at ``INIT``.

    ``INIT`` fires before the Trainer shards the model and builds the optimizer, so the
    FSDP2 mixed-precision policy, the fp16 gradient scaler and autocast all follow this
    setting. It overrides the Trainer's ``precision`` argument (a differing one is logged).

    Args:
        precision: ``amp_bf16`` (default), ``amp_fp16`` or ``fp32``.

    Raises:
        ValueError: an unknown precision; at ``INIT``, ``amp_bf16`` on a CUDA device without
            native bf16 (pre-Ampere GPU, or NCCL < 2.10): use ``amp_fp16`` there.
    """

    events = frozenset({Event.INIT})

    def __init__(self, precision: str = "amp_bf16") -> None:
        self.precision = Precision.parse(precision).value

    def match(self, event: Event, state: State) -> bool:
        return event == Event.INIT

    def apply(self, event: Event, state: State, logger: Any) -> None:
        if self.precision == Precision.AMP_BF16.value and not bf16_supported(state.device):
            raise ValueError(
                f"precision amp_bf16 is not natively supported on {state.device} (it needs an "
                f"Ampere or newer GPU and NCCL >= 2.10); use MixedPrecision(precision="
                f"'amp_fp16') or 'fp32'.")
        if state.precision != self.precision:
            log.info("MixedPrecision: precision %s -> %s", state.precision, self.precision)
        state.precision = self.precision
