"""``cadence.optim``: Composer's ``composer.optim`` path: the stateless learning-rate
schedulers (:mod:`cadence.trainer.schedulers`) and the decoupled-weight-decay optimizers
(:mod:`cadence.trainer.optimizers`), where they live."""

from __future__ import annotations

from cadence.trainer.optimizers import DecoupledAdamW, DecoupledSGDW
from cadence.trainer.schedulers import (
    ComposerScheduler, ConstantScheduler, ConstantWithWarmupScheduler, CosineAnnealingScheduler,
    CosineAnnealingWarmRestartsScheduler, CosineAnnealingWithWarmupScheduler, ExponentialScheduler,
    LinearScheduler, LinearWithWarmupScheduler, MultiStepScheduler, MultiStepWithWarmupScheduler,
    PolynomialScheduler, PolynomialWithWarmupScheduler, StepScheduler, compile_composer_scheduler,
)

__all__ = [
    "ComposerScheduler", "ConstantScheduler", "ConstantWithWarmupScheduler",
    "CosineAnnealingScheduler", "CosineAnnealingWarmRestartsScheduler",
    "CosineAnnealingWithWarmupScheduler", "DecoupledAdamW", "DecoupledSGDW",
    "ExponentialScheduler", "LinearScheduler", "LinearWithWarmupScheduler",
    "MultiStepScheduler", "MultiStepWithWarmupScheduler", "PolynomialScheduler",
    "PolynomialWithWarmupScheduler", "StepScheduler", "compile_composer_scheduler",
]
