"""Optimizers and learning-rate schedules a run file can name.

Optimizers are torch's own (``adamw``, ``adam``, ``sgd``), built as
``cls(model.parameters(), **kwargs)``.

Schedules follow Composer's "ComposerScheduler" idea (``composer/optim/scheduler.py``): a
schedule is a function of the run's :class:`~cadence.State` that returns a multiplier of
the optimizer's base learning rate, with durations in :class:`~cadence.Time` units, so
``t_warmup: 100ba`` or ``t_warmup: 0.05dur`` means the same whatever the dataset size. The
Trainer turns each into a :class:`torch.optim.lr_scheduler.LambdaLR` stepped once per batch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable

import torch

from cadence.trainer.core.time import Time, TimeUnit
from cadence.trainer.registry import optimizers, schedulers

if TYPE_CHECKING:
    from cadence.trainer.core.state import State

__all__ = [
    "ComposerScheduler", "ConstantWithWarmupScheduler", "LinearWithWarmupScheduler",
    "CosineAnnealingWithWarmupScheduler", "compile_scheduler", "time_in_batches",
]

optimizers.register("adamw", torch.optim.AdamW)
optimizers.register("adam", torch.optim.Adam)
optimizers.register("sgd", torch.optim.SGD)


def time_in_batches(time: Time, state: State) -> float:
    """``time`` converted to optimizer steps (batches).

    Raises:
        ValueError: the conversion needs a number that is unknown (``ep`` without a
            dataloader length, ``dur`` without ``max_duration``), or the unit is ``sp``/``tok``.
    """
    time = state.to_time(time)
    if time.unit == TimeUnit.BATCH:
        return float(time.value)
    if time.unit == TimeUnit.EPOCH:
        if not state.dataloader_len:
            raise ValueError(
                f"Cannot convert {time} to batches: the train dataloader has no length. "
                f"Give scheduler times in 'ba' or 'dur' instead."
            )
        return float(time.value * state.dataloader_len)
    raise ValueError(
        f"Scheduler times must be in 'ba', 'ep' or 'dur', got {time}; samples and tokens per "
        f"batch can vary, so they do not map to steps."
    )


class ComposerScheduler:
    """Base class: ``__call__(state) -> float``, the multiplier of the base learning rate
    for the *next* optimizer step (called after ``state.timestamp`` has advanced)."""

    def __call__(self, state: State) -> float:
        raise NotImplementedError

    @staticmethod
    def _warmup(state: State, t_warmup: Time) -> float | None:
        """The linear-warmup multiplier, or ``None`` once warmup is over."""
        warmup = time_in_batches(t_warmup, state)
        step = state.timestamp.batch
        if warmup > 0 and step < warmup:
            return (step + 1) / (warmup + 1)
        return None


class ConstantWithWarmupScheduler(ComposerScheduler):
    """Linear warmup from ~0 to ``alpha`` over ``t_warmup``, then constant ``alpha``.

    Args:
        t_warmup: warmup length (Time string, e.g. ``"100ba"``, ``"0.05dur"``); default none.
        alpha: the multiplier after warmup; default 1.0.
    """

    def __init__(self, t_warmup: str = "0ba", alpha: float = 1.0) -> None:
        self.t_warmup = Time.from_input(t_warmup)
        self.alpha = float(alpha)

    def __call__(self, state: State) -> float:
        warm = self._warmup(state, self.t_warmup)
        return self.alpha * warm if warm is not None else self.alpha


class LinearWithWarmupScheduler(ComposerScheduler):
    """Linear warmup over ``t_warmup``, then linear decay from ``alpha_i`` to ``alpha_f`` at
    ``t_max`` (constant ``alpha_f`` after).

    Args:
        t_warmup: warmup length; default ``"0ba"``.
        alpha_i: multiplier at the end of warmup; default 1.0.
        alpha_f: multiplier at ``t_max``; default 0.0.
        t_max: where the decay ends; default ``"1dur"`` (the end of training).
    """

    def __init__(self, t_warmup: str = "0ba", alpha_i: float = 1.0, alpha_f: float = 0.0,
                 t_max: str = "1dur") -> None:
        self.t_warmup = Time.from_input(t_warmup)
        self.t_max = Time.from_input(t_max)
        self.alpha_i, self.alpha_f = float(alpha_i), float(alpha_f)

    def __call__(self, state: State) -> float:
        warm = self._warmup(state, self.t_warmup)
        if warm is not None:
            return self.alpha_i * warm
        start, end = time_in_batches(self.t_warmup, state), time_in_batches(self.t_max, state)
        frac = min(1.0, max(0.0, (state.timestamp.batch - start) / max(end - start, 1.0)))
        return self.alpha_i + (self.alpha_f - self.alpha_i) * frac


class CosineAnnealingWithWarmupScheduler(ComposerScheduler):
    """Linear warmup over ``t_warmup``, then cosine decay from 1 to ``alpha_f`` at ``t_max``.

    ``multiplier = alpha_f + (1 - alpha_f) * (1 + cos(pi * frac)) / 2`` where ``frac`` is the
    fraction of the decay phase elapsed (Loshchilov & Hutter, "SGDR", ICLR 2017, without
    restarts; warmup as in Goyal et al. 2017).

    Args:
        t_warmup: warmup length; default ``"0ba"``.
        t_max: where the decay ends; default ``"1dur"``.
        alpha_f: final multiplier; default 0.0.
    """

    def __init__(self, t_warmup: str = "0ba", t_max: str = "1dur", alpha_f: float = 0.0) -> None:
        self.t_warmup = Time.from_input(t_warmup)
        self.t_max = Time.from_input(t_max)
        self.alpha_f = float(alpha_f)

    def __call__(self, state: State) -> float:
        warm = self._warmup(state, self.t_warmup)
        if warm is not None:
            return warm
        start, end = time_in_batches(self.t_warmup, state), time_in_batches(self.t_max, state)
        frac = min(1.0, max(0.0, (state.timestamp.batch - start) / max(end - start, 1.0)))
        return self.alpha_f + (1.0 - self.alpha_f) * (1.0 + math.cos(math.pi * frac)) / 2.0


schedulers.register("constant_with_warmup", ConstantWithWarmupScheduler)
schedulers.register("linear_decay_with_warmup", LinearWithWarmupScheduler)
schedulers.register("cosine_decay_with_warmup", CosineAnnealingWithWarmupScheduler)


def compile_scheduler(
    scheduler: Any, optimizer: torch.optim.Optimizer, state: State
) -> Any:
    """A torch LR scheduler for ``scheduler``: a :class:`ComposerScheduler` (or any
    ``Callable[[State], float]``) becomes a ``LambdaLR`` reading ``state``; a torch
    ``LRScheduler`` is returned as is.

    Raises:
        TypeError: ``scheduler`` is neither.
    """
    if isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler):
        return scheduler
    if callable(scheduler):
        fn: Callable[[State], float] = scheduler
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _step: fn(state))
    raise TypeError(
        f"schedulers must be ComposerSchedulers (callables of State) or torch LRSchedulers, "
        f"got {type(scheduler).__name__}."
    )

