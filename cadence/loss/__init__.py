"""Loss functions: ``cadence.loss`` mirrors Composer's ``composer.loss``.

:func:`soft_cross_entropy` is the default loss of
:class:`~cadence.models.tasks.classification.ComposerClassifier`.
"""

from __future__ import annotations

from cadence.loss.loss import (
    DiceLoss, binary_cross_entropy_with_logits, loss_registry, soft_cross_entropy,
)
from cadence.loss.utils import ensure_targets_one_hot, infer_target_type

__all__ = ["DiceLoss", "binary_cross_entropy_with_logits", "ensure_targets_one_hot",
           "infer_target_type", "loss_registry", "soft_cross_entropy"]
