"""Loss functions: ``cadence.loss`` mirrors Composer's ``composer.loss``.

:func:`soft_cross_entropy` is the default loss of
:class:`~cadence.models.tasks.classification.ComposerClassifier`.
"""

from __future__ import annotations

from cadence.loss.loss import infer_target_type, loss_registry, soft_cross_entropy

__all__ = ["infer_target_type", "loss_registry", "soft_cross_entropy"]
