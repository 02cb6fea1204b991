"""The Trainer and what it is built from. ``from cadence.trainer import Trainer`` works as
Composer's ``from composer.trainer import Trainer``; the Trainer is imported on first use,
so importing a submodule (``cadence.core.time``) stays light."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cadence._lazy import lazy_exports

if TYPE_CHECKING:
    from cadence.trainer.preemption import Preempted
    from cadence.trainer.trainer import Trainer

__all__ = ["Trainer", "Preempted"]

__getattr__, __dir__ = lazy_exports(__name__, {"Trainer": "cadence.trainer.trainer",
                                               "Preempted": "cadence.trainer.preemption"})
