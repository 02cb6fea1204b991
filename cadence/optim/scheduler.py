"""Learning-rate schedules as functions of time: Composer's stateless schedulers.

A schedule is a :class:`ComposerScheduler`: ``scheduler(state, ssr=1.0) -> float``, the
multiplier :math:`\\alpha(t)` of the optimizer's initial learning rate at the run's current
time (``state.timestamp``), so the learning rate is :math:`\\eta(t) = \\eta_i \\alpha(t)`. Any
function ``(state) -> float`` is one too. Durations are :class:`~cadence.Time` s or time
strings in any unit (``"100ba"``, ``"2ep"``, ``"0.05dur"``, ``"1e6tok"``, ``"600sec"``), so
``t_warmup: 0.05dur`` means the same whatever the dataset size.
:func:`compile_composer_scheduler` turns a schedule into a ``torch.optim.lr_scheduler.LambdaLR``
that reads the state, stepped once per batch after the timestamp has advanced.

``ssr`` is the scale-schedule ratio (the Trainer's ``scale_schedule_ratio``): a schedule with
ratio :math:`\\sigma` is stretched in time, :math:`\\alpha_\\sigma(t) = \\alpha(t / \\sigma)`.
Warmups are not stretched unless ``scale_warmup=True``.

Names a run file can use (``scheduler: {name: cosine_decay_with_warmup, t_warmup: 100ba}``),
Composer's registry names: ``step``, ``multistep``, ``constant``, ``linear_decay``,
``exponential``, ``cosine_decay``, ``cosine_warmrestart``, ``polynomial``,
``multistep_with_warmup``, ``constant_with_warmup``, ``linear_decay_with_warmup``,
``cosine_decay_with_warmup``, ``polynomial_decay_with_warmup``; and each class name.

Source: MosaicML Composer, ``composer/optim/scheduler.py`` (same classes, arguments,
defaults and formulas). On purpose, unlike Composer: a ``dur`` time needs the dataloader's
length only when ``max_duration`` is in epochs (Composer asks for it always), and a missing
``max_duration`` raises a ``ValueError`` that says where to set it (Composer asserts).
"""

from __future__ import annotations

import inspect
import math
import warnings
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, Sequence, Union

import torch

from cadence.core.time import Time, TimeUnit
from cadence.registry import schedulers as scheduler_registry

if TYPE_CHECKING:
    from cadence.core.state import State

__all__ = [
    "ComposerScheduler", "compile_composer_scheduler", "scheduler_multiplier", "StepScheduler", "MultiStepScheduler",
    "ConstantScheduler", "LinearScheduler", "ExponentialScheduler", "CosineAnnealingScheduler",
    "CosineAnnealingWarmRestartsScheduler", "PolynomialScheduler", "MultiStepWithWarmupScheduler",
    "ConstantWithWarmupScheduler", "LinearWithWarmupScheduler", "CosineAnnealingWithWarmupScheduler",
    "PolynomialWithWarmupScheduler",
]

TimeArg = Union[str, Time]

_ZERO_WARMUP = ("The warmup duration is 0. If you gave warmup as a fraction of training ('dur'), "
                "note that it is computed in the unit of max_duration.")


if TYPE_CHECKING:
    _SchedulerBase = Protocol  # for type checkers: any (state, ssr) -> float qualifies
else:
    _SchedulerBase = object  # at run time a plain base class, as Composer's


class ComposerScheduler(_SchedulerBase):
    """A stateless schedule: ``__call__(state, ssr=1.0) -> float``, the learning-rate
    multiplier now. A plain function ``(state) -> float`` qualifies (without ``ssr`` it
    cannot take a ``scale_schedule_ratio`` other than 1).

    At run time this is a plain base class, as Composer's is: ``issubclass(cls,
    ComposerScheduler)`` is True for the schedulers here and their subclasses (llm-foundry's
    registry checks it), False for anything else; type checkers see a ``Protocol``.
    """

    def __call__(self, state: State, ssr: float = 1.0) -> float:
        """The multiplier of the initial learning rate at ``state.timestamp``.

        Args:
            state: the run's State (its ``timestamp``, ``max_duration``, ``dataloader_len``).
            ssr: scale-schedule ratio: the schedule is stretched by this factor in time.
        """
        raise NotImplementedError


def _convert_time(time: TimeArg, state: State, ssr: float = 1.0) -> Time[int]:
    """``time`` in a unit the timestamp counts, scaled by ``ssr``: ``dur`` becomes
    ``max_duration``'s unit (batches when that is epochs), epochs become batches.

    Raises:
        ValueError: no ``max_duration`` for a ``dur`` time, or no dataloader length where
            epochs must become batches.
    """
    if isinstance(time, str):
        time = Time.from_timestring(time)
    max_duration = state.max_duration
    if time.unit == TimeUnit.DURATION:
        if max_duration is None:
            raise ValueError(f"The scheduler time {time} is a fraction of max_duration, which is "
                             f"not set; set max_duration on the Trainer (or fit(duration=...)).")
        if max_duration.unit == TimeUnit.EPOCH:
            length = _dataloader_len(state, time)
            return Time(int(time.value * length * max_duration.value), TimeUnit.BATCH)
        return Time(int(time.value * max_duration.value), max_duration.unit)
    if time.unit == TimeUnit.EPOCH:
        # ssr stretches epochs at batch granularity (1ep * 0.5 must not become 0ep)
        time = Time(time.value * _dataloader_len(state, time), TimeUnit.BATCH)
    return Time(int(time.value * ssr), time.unit)


def _dataloader_len(state: State, time: Time) -> int:
    if state.dataloader_len is None:
        raise ValueError(f"Cannot convert the scheduler time {time} to batches: the train "
                         f"dataloader has no length. Give scheduler times in 'ba' (or another "
                         f"unit the timestamp counts) instead.")
    return int(state.dataloader_len)


def _check_warmup_and_t_max(t_warmup: Time, t_max: Time, state: State) -> None:
    """Composer's two checks of a warmup schedule with a ``t_max``, on the converted times
    (``dur`` in ``max_duration``'s unit, epochs in batches): warmup and ``t_max`` in one unit,
    and ``t_max`` not before ``max_duration`` (the schedule must cover the whole run).

    Raises:
        ValueError: "Cannot use warmup scheduler with t_max ..." (units differ) or
            "t_max ... must be greater than or equal to max_duration ..." (Composer's
            messages), raised when the scheduler is first compiled: at ``Trainer(...)`` or
            ``fit()``, before any batch.
    """
    if t_warmup.unit != t_max.unit:
        raise ValueError(
            f"Cannot use warmup scheduler with t_max {t_max} with units {t_max.unit.value} and "
            f"t_warmup {t_warmup} with units {t_warmup.unit.value}. t_warmup and t_max must use "
            f"the same units (after 'dur' becomes max_duration's unit and epochs become "
            f"batches).")
    max_duration = state.max_duration
    if max_duration is None:
        return
    covered: bool | None = None
    if t_max.unit == max_duration.unit:
        covered = t_max.value >= max_duration.value
    elif state.dataloader_len is not None and {t_max.unit, max_duration.unit} == {
            TimeUnit.BATCH, TimeUnit.EPOCH}:
        length = int(state.dataloader_len)
        covered = t_max.value * (length if t_max.unit == TimeUnit.EPOCH else 1) >= \
            max_duration.value * (length if max_duration.unit == TimeUnit.EPOCH else 1)
    if covered is False:
        raise ValueError(
            f"t_max {t_max} must be greater than or equal to max_duration {max_duration}: the "
            f"schedule would end before training does. Lengthen t_max (default '1dur') or "
            f"shorten max_duration.")


def _cosine_anneal(x: float, min_y: float = 0.0, max_y: float = 1.0) -> float:
    """``min_y + (max_y - min_y) * (1 + cos(pi * x)) / 2`` with ``x`` clipped to ``[0, 1]``."""
    x = min(max(x, 0.0), 1.0)
    return min_y + (max_y - min_y) * (1 + math.cos(x * math.pi)) / 2


def _fraction(current: Time, start: Time, end: Time) -> float:
    """How far ``current`` is from ``start`` to ``end``, at most 1 (0 when ``end <= start``)."""
    return min(1.0, float((current - start) / (end - start))) if end > start else 0.0


class StepScheduler(ComposerScheduler):
    """Decays the learning rate by ``gamma`` every ``step_size``:
    :math:`\\alpha(t) = \\gamma^{\\lfloor t / \\rho \\rfloor}` (torch's ``StepLR``).

    Args:
        step_size: time between decays (``"10ep"``, ``"1000ba"``).
        gamma: multiplicative decay factor. Default 0.1.
    """

    def __init__(self, step_size: TimeArg, gamma: float = 0.1) -> None:
        self.step_size = step_size
        self.gamma = gamma

    def __call__(self, state: State, ssr: float = 1.0) -> float:
        step_size = _convert_time(self.step_size, state, ssr=ssr)
        steps = int(state.timestamp.get(step_size.unit) / step_size)
        return self.gamma ** steps


class MultiStepScheduler(ComposerScheduler):
    """Decays the learning rate by ``gamma`` at each milestone reached:
    :math:`\\alpha(t) = \\gamma^x`, :math:`x` the number of milestones :math:`\\le t`
    (torch's ``MultiStepLR``).

    Args:
        milestones: times at which the learning rate decays.
        gamma: multiplicative decay factor. Default 0.1.
    """

    def __init__(self, milestones: Sequence[TimeArg], gamma: float = 0.1) -> None:
        self.milestones = list(milestones)
        self.gamma = gamma

    def __call__(self, state: State, ssr: float = 1.0) -> float:
        factor = 1.0
        for milestone in self.milestones:
            if state.timestamp >= _convert_time(milestone, state, ssr=ssr):
                factor *= self.gamma
        return factor


class ConstantScheduler(ComposerScheduler):
    """Holds the multiplier at ``alpha`` until ``t_max``, then 1.0 (torch's ``ConstantLR``).

    Args:
        alpha: the multiplier while active. Default 1.0.
        t_max: how long it is active. Default ``"1dur"``.
    """

    def __init__(self, alpha: float = 1.0, t_max: TimeArg = "1dur") -> None:
        self.alpha = alpha
        self.t_max = t_max

    def __call__(self, state: State, ssr: float = 1.0) -> float:
        t_max = _convert_time(self.t_max, state, ssr=ssr)
        return self.alpha if state.timestamp < t_max else 1.0


class LinearScheduler(ComposerScheduler):
    """Moves the multiplier linearly from ``alpha_i`` to ``alpha_f`` over ``t_max``, then
    holds ``alpha_f``: :math:`\\alpha(t) = \\alpha_i + (\\alpha_f - \\alpha_i) \\min(t / t_{max}, 1)`.

    Unlike torch's ``LinearLR`` (1/3 up to 1), the default decays from 1 to 0.

    Args:
        alpha_i: initial multiplier. Default 1.0.
        alpha_f: final multiplier. Default 0.0.
        t_max: duration. Default ``"1dur"``.
    """

    def __init__(self, alpha_i: float = 1.0, alpha_f: float = 0.0, t_max: TimeArg = "1dur") -> None:
        self.alpha_i = alpha_i
        self.alpha_f = alpha_f
        self.t_max = Time.from_timestring(t_max) if isinstance(t_max, str) else t_max

    def __call__(self, state: State, ssr: float = 1.0) -> float:
        t_max = _convert_time(self.t_max, state, ssr=ssr)
        frac = min(1.0, float(state.timestamp.get(t_max.unit) / t_max)) if t_max.value else 1.0
        return self.alpha_i + frac * (self.alpha_f - self.alpha_i)


class ExponentialScheduler(ComposerScheduler):
    """Decays the multiplier by ``gamma`` per ``decay_period``, continuously:
    :math:`\\alpha(t) = \\gamma^{t / \\rho}` (torch's ``ExponentialLR``).

    Args:
        gamma: multiplicative decay factor per period.
        decay_period: the period. Default ``"1ep"``.
    """

    def __init__(self, gamma: float, decay_period: TimeArg = "1ep") -> None:
        self.gamma = gamma
        self.decay_period = decay_period

    def __call__(self, state: State, ssr: float = 1.0) -> float:
        period = _convert_time(self.decay_period, state, ssr)
        return self.gamma ** float(state.timestamp.get(period.unit) / period)


class CosineAnnealingScheduler(ComposerScheduler):
    """Cosine decay from 1 to ``alpha_f`` over ``t_max``, then ``alpha_f``:
    :math:`\\alpha(t) = \\alpha_f + (1 - \\alpha_f) \\frac{1}{2}(1 + \\cos(\\pi \\tau))`,
    :math:`\\tau = \\min(t / t_{max}, 1)` (Loshchilov & Hutter, "SGDR", ICLR 2017, without
    restarts; torch's ``CosineAnnealingLR``).

    Args:
        t_max: duration. Default ``"1dur"``.
        alpha_f: final multiplier. Default 0.0.
    """

    def __init__(self, t_max: TimeArg = "1dur", alpha_f: float = 0.0) -> None:
        self.t_max = t_max
        self.alpha_f = alpha_f

    def __call__(self, state: State, ssr: float = 1.0) -> float:
        t_max = _convert_time(self.t_max, state, ssr=ssr)
        frac = float(state.timestamp.get(t_max.unit) / t_max) if t_max.value else 1.0
        return _cosine_anneal(frac, min_y=self.alpha_f)


class CosineAnnealingWarmRestartsScheduler(ComposerScheduler):
    """Cosine decay from 1 to ``alpha_f``, restarting at 1 after each interval; the first
    interval is ``t_0`` long and each next one ``t_mult`` times the last (SGDR, Loshchilov &
    Hutter 2017; torch's ``CosineAnnealingWarmRestarts``).

    Args:
        t_0: the first interval.
        t_mult: growth of each interval over the last. Default 1.0.
        alpha_f: the multiplier at each interval's end. Default 0.0.

    Raises:
        ValueError: an interval decays to 0 (``t_mult`` < 1).
    """

    def __init__(self, t_0: TimeArg, t_mult: float = 1.0, alpha_f: float = 0.0) -> None:
        self.t_0 = t_0
        self.t_mult = t_mult
        self.alpha_f = alpha_f

    def __call__(self, state: State, ssr: float = 1.0) -> float:
        t_0 = _convert_time(self.t_0, state, ssr=ssr)
        now = state.timestamp.get(t_0.unit)
        length, end = t_0, t_0
        while end <= now:
            if length.value == 0:
                raise ValueError("The interval between restarts of the cosine warm-restarts "
                                 "schedule decayed to 0; use t_mult >= 1 or a longer t_0.")
            length = Time(int(self.t_mult * length.value), length.unit)
            end = end + length
        start = end - length
        return _cosine_anneal(float((now - start) / length), min_y=self.alpha_f)


class PolynomialScheduler(ComposerScheduler):
    """Multiplier proportional to a power of the fraction of time left:
    :math:`\\alpha(t) = \\alpha_f + (1 - \\alpha_f)(1 - \\tau)^{\\kappa}`,
    :math:`\\tau = t / t_{max}`.

    Args:
        power: the exponent :math:`\\kappa`.
        t_max: duration. Default ``"1dur"``.
        alpha_f: final multiplier. Default 0.0.
    """

    def __init__(self, power: float, t_max: TimeArg = "1dur", alpha_f: float = 0.0) -> None:
        self.t_max = t_max
        self.power = power
        self.alpha_f = alpha_f

    def __call__(self, state: State, ssr: float = 1.0) -> float:
        t_max = _convert_time(self.t_max, state, ssr=ssr)
        frac = min(1.0, float(state.timestamp.get(t_max.unit) / t_max)) if t_max.value else 1.0
        return self.alpha_f + (1.0 - frac) ** self.power * (1.0 - self.alpha_f)


class _WithWarmup(ComposerScheduler):
    """Shared warmup: linear from 0 to ``peak`` over ``t_warmup`` (not stretched by ``ssr``
    unless ``scale_warmup``), then :meth:`after_warmup`."""

    t_warmup: TimeArg
    scale_warmup: bool
    warmup_scheduler: LinearScheduler

    def __call__(self, state: State, ssr: float = 1.0) -> float:
        t_warmup = _convert_time(self.t_warmup, state)
        t_max = getattr(self, "t_max", None)
        if t_max is not None:  # MultiStepWithWarmupScheduler has none: any warmup unit
            _check_warmup_and_t_max(t_warmup, _convert_time(t_max, state, ssr=ssr), state)
        if t_warmup.value == 0:
            warnings.warn(_ZERO_WARMUP, UserWarning, stacklevel=2)
        if state.timestamp < t_warmup:
            if self.scale_warmup:
                return self.warmup_scheduler(state, ssr)
            return self.warmup_scheduler(state)
        return self.after_warmup(state, ssr, t_warmup)

    def after_warmup(self, state: State, ssr: float, t_warmup: Time) -> float:
        raise NotImplementedError


class MultiStepWithWarmupScheduler(_WithWarmup):
    """Linear warmup over ``t_warmup``, then :class:`MultiStepScheduler`.

    Args:
        t_warmup: warmup time (milestones inside it have no effect until it ends).
        milestones: times at which the learning rate decays.
        gamma: multiplicative decay factor. Default 0.1.
        scale_warmup: stretch the warmup by ``ssr`` too. Default False.
    """

    def __init__(self, t_warmup: TimeArg, milestones: Sequence[TimeArg], gamma: float = 0.1,
                 scale_warmup: bool = False) -> None:
        self.t_warmup = t_warmup
        self.milestones = list(milestones)
        self.gamma = gamma
        self.scale_warmup = scale_warmup
        self.warmup_scheduler = LinearScheduler(alpha_i=0.0, alpha_f=1.0, t_max=t_warmup)
        self.step_scheduler = MultiStepScheduler(milestones=milestones, gamma=gamma)

    def after_warmup(self, state: State, ssr: float, t_warmup: Time) -> float:
        return self.step_scheduler(state, ssr)


class ConstantWithWarmupScheduler(_WithWarmup):
    """Linear warmup from 0 to ``alpha`` over ``t_warmup``, then ``alpha`` until ``t_max``,
    then 1.0 (:class:`ConstantScheduler`).

    Args:
        t_warmup: warmup time.
        alpha: the multiplier after warmup. Default 1.0.
        t_max: until when ``alpha`` holds. Default ``"1dur"``.
        scale_warmup: stretch the warmup by ``ssr`` too. Default False.
    """

    def __init__(self, t_warmup: TimeArg, alpha: float = 1.0, t_max: TimeArg = "1dur",
                 scale_warmup: bool = False) -> None:
        self.t_warmup = t_warmup
        self.alpha = alpha
        self.t_max = t_max
        self.scale_warmup = scale_warmup
        self.warmup_scheduler = LinearScheduler(alpha_i=0.0, alpha_f=alpha, t_max=t_warmup)
        self.scheduler = ConstantScheduler(alpha=alpha, t_max=t_max)

    def after_warmup(self, state: State, ssr: float, t_warmup: Time) -> float:
        return self.scheduler(state, ssr)


class LinearWithWarmupScheduler(_WithWarmup):
    """Linear warmup from 0 to ``alpha_i`` over ``t_warmup``, then linear from ``alpha_i`` to
    ``alpha_f`` at ``t_max``:
    :math:`\\alpha(t) = \\alpha_i + (\\alpha_f - \\alpha_i)\\tau_w`,
    :math:`\\tau_w = \\min((t - t_{warmup}) / (t_{max} - t_{warmup}), 1)`.

    Args:
        t_warmup: warmup time.
        alpha_i: multiplier at the end of warmup. Default 1.0.
        alpha_f: final multiplier. Default 0.0.
        t_max: where the decay ends. Default ``"1dur"``.
        scale_warmup: stretch the warmup by ``ssr`` too. Default False.
    """

    def __init__(self, t_warmup: TimeArg, alpha_i: float = 1.0, alpha_f: float = 0.0,
                 t_max: TimeArg = "1dur", scale_warmup: bool = False) -> None:
        self.t_warmup = t_warmup
        self.alpha_i = alpha_i
        self.alpha_f = alpha_f
        self.t_max = t_max
        self.scale_warmup = scale_warmup
        self.warmup_scheduler = LinearScheduler(alpha_i=0.0, alpha_f=alpha_i, t_max=t_warmup)

    def after_warmup(self, state: State, ssr: float, t_warmup: Time) -> float:
        t_max = _convert_time(self.t_max, state, ssr=ssr)
        frac = _fraction(state.timestamp.get(t_warmup.unit), t_warmup, t_max)
        return self.alpha_i + frac * (self.alpha_f - self.alpha_i)


class CosineAnnealingWithWarmupScheduler(_WithWarmup):
    """Linear warmup from 0 to 1 over ``t_warmup``, then cosine decay to ``alpha_f`` at
    ``t_max``: :math:`\\alpha(t) = \\alpha_f + (1 - \\alpha_f)\\frac{1}{2}(1 + \\cos(\\pi\\tau_w))`,
    :math:`\\tau_w = \\min((t - t_{warmup}) / (t_{max} - t_{warmup}), 1)` (SGDR without
    restarts, warmup as in Goyal et al. 2017).

    Args:
        t_warmup: warmup time.
        t_max: where the decay ends. Default ``"1dur"``.
        alpha_f: final multiplier. Default 0.0.
        scale_warmup: stretch the warmup by ``ssr`` too. Default False.
    """

    def __init__(self, t_warmup: TimeArg, t_max: TimeArg = "1dur", alpha_f: float = 0.0,
                 scale_warmup: bool = False) -> None:
        self.t_warmup = t_warmup
        self.t_max = t_max
        self.alpha_f = alpha_f
        self.scale_warmup = scale_warmup
        self.warmup_scheduler = LinearScheduler(alpha_i=0.0, alpha_f=1.0, t_max=t_warmup)

    def after_warmup(self, state: State, ssr: float, t_warmup: Time) -> float:
        t_max = _convert_time(self.t_max, state, ssr=ssr)
        frac = _fraction(state.timestamp.get(t_warmup.unit), t_warmup, t_max)
        return _cosine_anneal(frac, min_y=self.alpha_f)


class PolynomialWithWarmupScheduler(_WithWarmup):
    """Linear warmup from 0 to 1 over ``t_warmup``, then
    :math:`\\alpha(t) = \\alpha_f + (1 - \\alpha_f)(1 - \\tau_w)^{\\kappa}`,
    :math:`\\tau_w = \\min((t - t_{warmup}) / (t_{max} - t_{warmup}), 1)`.

    Args:
        t_warmup: warmup time.
        power: the exponent :math:`\\kappa`. Default 2.0.
        t_max: where the decay ends. Default ``"1dur"``.
        alpha_f: final multiplier. Default 0.0.
        scale_warmup: stretch the warmup by ``ssr`` too. Default False.
    """

    def __init__(self, t_warmup: TimeArg, power: float = 2.0, t_max: TimeArg = "1dur",
                 alpha_f: float = 0.0, scale_warmup: bool = False) -> None:
        self.t_warmup = t_warmup
        self.power = power
        self.t_max = t_max
        self.alpha_f = alpha_f
        self.scale_warmup = scale_warmup
        self.warmup_scheduler = LinearScheduler(alpha_i=0.0, alpha_f=1.0, t_max=t_warmup)

    def after_warmup(self, state: State, ssr: float, t_warmup: Time) -> float:
        t_max = _convert_time(self.t_max, state, ssr=ssr)
        frac = _fraction(state.timestamp.get(t_warmup.unit), t_warmup, t_max)
        return self.alpha_f + (1.0 - frac) ** self.power * (1.0 - self.alpha_f)


def scheduler_multiplier(scheduler: Callable[..., float], state: State, ssr: float = 1.0
                         ) -> Callable[[int], float]:
    """The ``lr_lambda`` of a ``LambdaLR``: ``scheduler(state, ssr)`` (or ``scheduler(state)``
    for a one-argument function), ignoring LambdaLR's step counter.

    Raises:
        ValueError: ``ssr != 1`` for a scheduler that takes no ``ssr`` (raised when called).
    """
    try:
        takes_ssr = len(inspect.signature(scheduler).parameters) >= 2
    except (TypeError, ValueError):
        takes_ssr = True

    def multiplier(step: int) -> float:
        del step  # the state's timestamp is the clock, not LambdaLR's counter
        if takes_ssr:
            return scheduler(state, ssr)
        if ssr != 1.0:
            raise ValueError(f"Scheduler {scheduler!r} takes no scale_schedule_ratio; to use "
                             f"scale_schedule_ratio={ssr}, it must accept (state, ssr).")
        return scheduler(state)

    return multiplier


def compile_composer_scheduler(scheduler: Callable[..., float], state: State, ssr: float = 1.0,
                               *, optimizer: Optional[torch.optim.Optimizer] = None,
                               ) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` whose factor is ``scheduler(state[, ssr])``: the one place a schedule
    becomes a torch scheduler (the Trainer's ``compile_scheduler`` calls it).

    Args:
        scheduler: a :class:`ComposerScheduler` or any ``(state) -> float``.
        state: the run's State; without ``optimizer``, it must hold exactly one optimizer.
        ssr: scale-schedule ratio passed to the scheduler.
        optimizer: the optimizer whose learning rate it sets; default the state's one
            optimizer (Composer's behaviour).

    Raises:
        NotImplementedError: no ``optimizer`` given and the state has no or several
            optimizers (as Composer).
        ValueError: ``ssr != 1`` for a scheduler that takes no ``ssr`` (raised when it runs).
    """
    if optimizer is None:
        if len(state.optimizers) != 1:
            raise NotImplementedError(f"A ComposerScheduler needs exactly one optimizer on the "
                                      f"state; it has {len(state.optimizers)}.")
        optimizer = state.optimizers[0]
    return torch.optim.lr_scheduler.LambdaLR(optimizer, scheduler_multiplier(scheduler, state, ssr))


_REGISTRY_NAMES: dict[str, type[Any]] = {
    "step": StepScheduler,
    "multistep": MultiStepScheduler,
    "constant": ConstantScheduler,
    "linear_decay": LinearScheduler,
    "exponential": ExponentialScheduler,
    "cosine_decay": CosineAnnealingScheduler,
    "cosine_warmrestart": CosineAnnealingWarmRestartsScheduler,
    "polynomial": PolynomialScheduler,
    "multistep_with_warmup": MultiStepWithWarmupScheduler,
    "constant_with_warmup": ConstantWithWarmupScheduler,
    "linear_decay_with_warmup": LinearWithWarmupScheduler,
    "cosine_decay_with_warmup": CosineAnnealingWithWarmupScheduler,
    "polynomial_decay_with_warmup": PolynomialWithWarmupScheduler,
}
for _name, _cls in _REGISTRY_NAMES.items():
    scheduler_registry.register(_name, _cls)
    scheduler_registry.register(_cls.__name__, _cls)
