"""When an evaluator runs during ``fit``: on its ``eval_interval`` and when training ends;
never with an interval of ``0`` (``0``, ``"0ep"``, ``"0ba"``: Composer's way to turn
evaluation off, the end of training included).

An interval is a :class:`~cadence.Time` (``"1ep"``, ``"500ba"``, ``"4096sp"``, ``"0.25dur"``,
``"60sec"``; an int means epochs) or, as in Composer, a callable ``(state, event) -> bool``
asked after ``BATCH_END`` and after ``EPOCH_END`` (e.g. from
:func:`~cadence.utils.create_interval_scheduler` with ``checkpoint_events=False``).
"""

from __future__ import annotations

from typing import Any, Callable, Union

from cadence.core import Event, State, Time, TimeUnit
from cadence.utils.misc import interval_crossed

__all__ = ["EvalInterval", "eval_due", "parse_eval_interval", "training_done"]

EvalInterval = Union[Time, Callable[[State, Event], bool]]


def parse_eval_interval(interval: Any, name: str = "eval_interval") -> EvalInterval:
    """A callable as it is, else a :class:`Time` (an int means epochs).

    Raises:
        ValueError: a bad time string (the message names ``name``).
    """
    if callable(interval):
        return interval
    try:
        return Time.from_input(interval, TimeUnit.EPOCH)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}={interval!r} is neither a Time (e.g. '1ep', '500ba', "
                         f"'0.5dur') nor a callable (state, event) -> bool: {exc}") from None


def training_done(state: State) -> bool:
    """Whether ``fit`` stops after this batch (``max_duration`` reached or stop asked)."""
    assert state.max_duration is not None
    return bool(state.stop_training) or state.reached(state.max_duration)


def eval_due(state: State, interval: EvalInterval, event: Event) -> bool:
    """Whether to evaluate after ``event`` (``BATCH_END`` or ``EPOCH_END``).

    A Time interval is due when the last batch crossed a multiple of it (epochs: at the
    epoch's end), and once when training ends: after the last epoch when ``max_duration``
    is in epochs, else after the last batch. A zero interval outside ``dur`` is never due.
    """
    if callable(interval):
        return bool(interval(state, event))
    assert state.max_duration is not None
    if interval.unit != TimeUnit.DURATION and interval.value <= 0:
        return False  # eval_interval=0 turns evaluation off (Composer's)
    if interval.unit != TimeUnit.DURATION:
        interval = state.to_time(interval)
    # 'dur' stays a fraction: interval_crossed counts it in max_duration's unit (batches for
    # epochs), rounded up, as Composer's create_interval_scheduler does
    ends_in_epochs = state.max_duration.unit == TimeUnit.EPOCH
    value = float(interval.value)
    if interval.unit == TimeUnit.EPOCH:
        if event == Event.EPOCH_END:
            if not ends_in_epochs and training_done(state):
                return False  # the last batch's BATCH_END has just evaluated (once, as Composer)
            on_boundary = value > 0 and int(state.timestamp.epoch) % value == 0
            return on_boundary or (ends_in_epochs and training_done(state))
        return not ends_in_epochs and training_done(state)
    # ba / sp / tok / sec: due when the last batch crossed a multiple of the interval
    crossed = interval_crossed(state, interval)
    if event == Event.EPOCH_END:  # the end of training, unless the last batch just evaluated
        return ends_in_epochs and training_done(state) and not crossed
    return crossed or (training_done(state) and not ends_in_epochs)
