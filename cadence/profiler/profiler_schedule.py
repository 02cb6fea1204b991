"""``cyclic_schedule``: the profiler's per-epoch cycle of skipped, warm-up and recorded batches.

Source: MosaicML Composer's ``composer.profiler.cyclic_schedule`` (same arguments, defaults
and actions).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from cadence.profiler.profiler_action import ProfilerAction

if TYPE_CHECKING:
    from cadence.core import State

__all__ = ["cyclic_schedule"]


def _count(name: str, value: int, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"cyclic_schedule {name} must be an integer >= {minimum} (batches), "
                         f"got {value!r}.")
    return value


def cyclic_schedule(skip_first: int = 0, wait: int = 0, warmup: int = 1, active: int = 4,
                    repeat: int = 1) -> Callable[[State], ProfilerAction]:
    """A schedule ``(state) -> ProfilerAction`` that cycles within every epoch.

    Counting the batch's index in its epoch (``state.timestamp.batch_in_epoch``, from 0):
    the first ``skip_first`` batches (plus, after a resume, the batch the run resumed at:
    ``state.profiler.resumption_batch_idx``) are ``SKIP``; then ``repeat`` cycles (``0``: to
    the end of the epoch) of ``wait`` ``SKIP`` batches, ``warmup`` ``WARMUP`` batches and
    ``active`` ``ACTIVE`` batches, the cycle's last active batch ``ACTIVE_AND_SAVE``; later
    batches are ``SKIP``. An epoch's last batch, when active, is ``ACTIVE_AND_SAVE`` too, so
    no window spans two epochs.

    Args:
        skip_first: batches skipped at the start of each epoch (default 0).
        wait: skipped batches at the start of each cycle (default 0).
        warmup: warm-up batches per cycle (default 1).
        active: recorded batches per cycle (default 4; at least 1).
        repeat: cycles per epoch; ``0``: until the epoch ends (default 1).

    Raises:
        ValueError: a count that is not a non-negative integer, or ``active`` below 1.
    """
    skip_first, wait, warmup = (_count("skip_first", skip_first), _count("wait", wait),
                                _count("warmup", warmup))
    active, repeat = _count("active", active, minimum=1), _count("repeat", repeat)
    cycle = wait + warmup + active

    def schedule(state: State) -> ProfilerAction:
        index = int(state.timestamp.batch_in_epoch)
        profiler = getattr(state, "profiler", None)
        skip = skip_first + int(getattr(profiler, "resumption_batch_idx", 0) or 0)
        if index < skip or (repeat and index >= skip + cycle * repeat):
            return ProfilerAction.SKIP
        position = (index - skip) % cycle
        if position < wait:
            return ProfilerAction.SKIP
        if position < wait + warmup:
            return ProfilerAction.WARMUP
        length = state.dataloader_len
        last_in_epoch = length is not None and index == int(length) - 1
        if position == cycle - 1 or last_in_epoch:
            return ProfilerAction.ACTIVE_AND_SAVE
        return ProfilerAction.ACTIVE

    return schedule
