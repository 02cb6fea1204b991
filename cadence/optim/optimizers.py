"""Optimizers a run file can name, and how the Trainer turns schedules into torch schedulers.

Optimizers are torch's own (``adamw``, ``adam``, ``sgd``), built as
``cls(model.parameters(), **kwargs)``; Composer's decoupled ones are in
:mod:`cadence.optim.decoupled_weight_decay`. The schedules themselves (Composer's stateless
schedulers) live in :mod:`cadence.optim.scheduler`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from cadence.registry.arg_checks import at_least, declare_arg_checks, each, in_interval
from cadence.registry import optimizers
from cadence.optim.scheduler import ComposerScheduler, compile_composer_scheduler

if TYPE_CHECKING:
    from cadence.core.state import State

__all__ = ["compile_scheduler", "trainable_parameters"]

optimizers.register("adamw", torch.optim.AdamW)
optimizers.register("adam", torch.optim.Adam)
optimizers.register("sgd", torch.optim.SGD)
# The ranges torch checks when the optimizer is built, checked when the config is loaded.
for _adam in (torch.optim.AdamW, torch.optim.Adam):
    declare_arg_checks(_adam, lr=at_least(0.0), eps=at_least(0.0), weight_decay=at_least(0.0),
                       betas=each(in_interval(0.0, 1.0)))
declare_arg_checks(torch.optim.SGD, lr=at_least(0.0), momentum=at_least(0.0),
                   weight_decay=at_least(0.0))


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """``model``'s parameters that train (``requires_grad``): what the Trainer's default
    optimizer and a run file's optimizer are built over, so frozen weights (a ``peft``
    model's base) get no optimizer state and never appear in a checkpoint's optimizer."""
    return [p for p in model.parameters() if p.requires_grad]


def compile_scheduler(
    scheduler: Any, optimizer: torch.optim.Optimizer, state: State, ssr: float = 1.0
) -> Any:
    """A torch LR scheduler for ``scheduler``: a :class:`ComposerScheduler` (or any
    ``Callable[[State], float]``) becomes a ``LambdaLR`` on ``optimizer`` reading ``state``
    (:func:`~cadence.optim.scheduler.compile_composer_scheduler`); a torch ``LRScheduler`` is
    returned as is.

    Args:
        scheduler: the schedule.
        optimizer: the optimizer whose learning rate it sets.
        state: the run's State.
        ssr: the scale-schedule ratio (the Trainer's ``scale_schedule_ratio``).

    Raises:
        TypeError: ``scheduler`` is neither.
    """
    if isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler):
        return scheduler
    if callable(scheduler):
        return compile_composer_scheduler(scheduler, state, ssr, optimizer=optimizer)
    raise TypeError(
        f"schedulers must be ComposerSchedulers (callables of State) or torch LRSchedulers, "
        f"got {type(scheduler).__name__}."
    )
