"""Composer's ``composer.optim``: the stateless learning-rate schedulers
(:mod:`cadence.optim.scheduler`), the decoupled-weight-decay optimizers
(:mod:`cadence.optim.decoupled_weight_decay`) and the optimizers a run file can name
(:mod:`cadence.optim.optimizers`). Names are imported on first use (:mod:`cadence._lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cadence._lazy import lazy_exports

if TYPE_CHECKING:
    from cadence.optim.decoupled_weight_decay import DecoupledAdamW, DecoupledSGDW
    from cadence.optim.optimizers import compile_scheduler
    from cadence.optim.scheduler import (
        ComposerScheduler, ConstantScheduler, ConstantWithWarmupScheduler,
        CosineAnnealingScheduler, CosineAnnealingWarmRestartsScheduler,
        CosineAnnealingWithWarmupScheduler, ExponentialScheduler, LinearScheduler,
        LinearWithWarmupScheduler, MultiStepScheduler, MultiStepWithWarmupScheduler,
        PolynomialScheduler, PolynomialWithWarmupScheduler, StepScheduler,
        compile_composer_scheduler,
    )

_SCHEDULER = "cadence.optim.scheduler"
_LAZY = {
    "DecoupledAdamW": "cadence.optim.decoupled_weight_decay",
    "DecoupledSGDW": "cadence.optim.decoupled_weight_decay",
    "compile_scheduler": "cadence.optim.optimizers",
    **dict.fromkeys([
        "ComposerScheduler", "ConstantScheduler", "ConstantWithWarmupScheduler",
        "CosineAnnealingScheduler", "CosineAnnealingWarmRestartsScheduler",
        "CosineAnnealingWithWarmupScheduler", "ExponentialScheduler", "LinearScheduler",
        "LinearWithWarmupScheduler", "MultiStepScheduler", "MultiStepWithWarmupScheduler",
        "PolynomialScheduler", "PolynomialWithWarmupScheduler", "StepScheduler",
        "compile_composer_scheduler",
    ], _SCHEDULER),
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
