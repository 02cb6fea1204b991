"""The :class:`FreeOutputs` callback: drop the model's outputs once the loss is computed.

Source: MosaicML Composer's ``FreeOutputs`` (``composer/callbacks/free_outputs.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from cadence.registry import callbacks
from cadence.core import Callback

if TYPE_CHECKING:
    from cadence.core import State

__all__ = ["FreeOutputs"]


@callbacks.register("free_outputs")
class FreeOutputs(Callback):
    """Replaces ``state.outputs`` with an empty tensor at ``AFTER_LOSS``, so the training
    forward's outputs (for a language model, the ``[batch, seq, vocab]`` logits) are
    released as soon as the loss is computed.

    cadence's Trainer already drops ``state.outputs`` after the training metrics are updated,
    before backward, so on cadence this callback changes memory only between ``AFTER_LOSS``
    and that point; it exists so Composer code that lists it runs unchanged. Use it only
    when nothing reads the training outputs after the loss: training metrics
    (``model.get_metrics(is_train=True)``) would then get an empty tensor and fail, and
    callbacks after it at ``AFTER_LOSS`` see the empty tensor. The autograd graph still
    holds what backward needs. Evaluation is not affected.
    """

    def after_loss(self, state: State, logger: Any) -> None:
        del logger
        state.outputs = torch.Tensor()
