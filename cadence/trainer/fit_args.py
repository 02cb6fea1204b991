"""The arguments of ``Trainer.fit`` (Composer's): what each changes before training starts.

:func:`fit_changes` reads the run's :class:`~cadence.core.State`, checks ``fit()``'s
arguments and returns a :class:`FitChanges`: only what the call changes (a field left at
its default changes nothing). It writes nothing, so a bad argument is refused before any
change is made. The Trainer then applies them: the state's through
:meth:`FitChanges.apply_to_state` (the public :class:`~cadence.core.State` that algorithms
and callbacks also write), its own attributes itself.

Source: MosaicML Composer's ``Trainer.fit`` (``composer/trainer/trainer.py``): same names,
defaults and meaning. ``spin_dataloaders`` is accepted for Composer code: cadence resumes a
dataloader mid-epoch from the checkpoint's data position, which is what spinning achieved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional, Union

from cadence.core import Evaluator, State, Time, TimeUnit, Timestamp
from cadence.core.data_spec import DataSpec, ensure_data_spec
from cadence.core.precision import Precision
from cadence.optim.optimizers import compile_scheduler
from cadence.trainer.eval_schedule import parse_eval_interval
from cadence.trainer.trainer_options import (
    as_evaluators, as_list, dataloader_len, scale_duration, steps_schedulers_every_batch,
    subset_len,
)

__all__ = ["FitChanges", "fit_changes"]


@dataclass(frozen=True)
class FitChanges:
    """What one ``fit()`` call changes; ``None`` (or the default) leaves a thing as it is.

    Attributes:
        train_dataloader: the new train dataloader (its sampler checked, not yet aligned
            with the data-parallel ranks: the Trainer does that).
        train_data_spec: the :class:`~cadence.core.data_spec.DataSpec` it came in (or was
            wrapped in), with ``train_dataloader``.
        train_dataloader_label: its label (set with ``train_dataloader``).
        set_dataloader_len: whether ``dataloader_len`` is new (it may be None: unsized).
        dataloader_len: the batches per epoch (``train_subset_num_batches`` applied).
        reset_time: start the timestamp from 0.
        max_duration: the new ``max_duration`` (``duration`` more than now, scaled).
        scale_schedule_ratio: ``fit``'s ratio: the new schedulers are compiled with it, and
            it becomes the Trainer's when it is not 1.
        schedulers: new schedulers, not yet compiled (:meth:`apply_to_state` compiles them
            once the new ``max_duration``, which a schedule reads, is set).
        step_schedulers_every_batch: the new setting, when schedulers or it were given.
        evaluators: new evaluators (``eval_dataloader``).
        eval_interval: the parsed interval, with ``evaluators``.
        eval_subset_num_batches: the batches per evaluation, with ``evaluators``.
        auto_microbatch: the new microbatching: ``True`` for ``'auto'``, ``False`` for
            ``device_train_microbatch_size``; None: unchanged.
        device_train_microbatch_size: the new microbatch size (None with ``'auto'``).
        precision: the new precision's value (``"amp_fp16"``, ...).
    """

    train_dataloader: Optional[Iterable[Any]] = None
    train_data_spec: Optional[DataSpec] = None
    train_dataloader_label: str = "train"
    set_dataloader_len: bool = False
    dataloader_len: Optional[int] = None
    reset_time: bool = False
    max_duration: Optional[Time] = None
    scale_schedule_ratio: float = 1.0
    schedulers: Optional[list[Any]] = None
    step_schedulers_every_batch: Optional[bool] = None
    evaluators: Optional[list[Evaluator]] = None
    eval_interval: Any = None
    eval_subset_num_batches: int = -1
    auto_microbatch: Optional[bool] = None
    device_train_microbatch_size: Optional[int] = None
    precision: Optional[str] = None

    def apply_to_state(self, state: State) -> None:
        """Make the changes that belong to ``state``, in ``fit``'s order: the train
        dataloader, the timestamp, ``max_duration``, then the schedulers (compiled now: a
        schedule reads ``max_duration``), the evaluators, the microbatch size and precision.

        Args:
            state: the Trainer's state.
        """
        if self.train_dataloader is not None:
            state.train_dataloader = self.train_dataloader
            state.set_dataloader(self.train_dataloader, self.train_dataloader_label)
        if self.set_dataloader_len:
            state.dataloader_len = self.dataloader_len
        if self.reset_time:
            state.timestamp, state.previous_timestamp = Timestamp(), None
        state.max_duration = self.max_duration
        if self.schedulers is not None:
            state.schedulers = [compile_scheduler(s, state.optimizers[0], state,
                                                  self.scale_schedule_ratio)
                                for s in self.schedulers]
        if self.evaluators is not None:
            state.evaluators = self.evaluators
        if self.auto_microbatch is not None:
            state.device_train_microbatch_size = self.device_train_microbatch_size
        if self.precision is not None:
            state.precision = self.precision


def fit_changes(
    state: State,
    *,
    train_dataloader: Union[Iterable[Any], DataSpec, None] = None,
    train_dataloader_label: str = "train",
    train_subset_num_batches: int = -1,
    duration: Union[int, str, Time, None] = None,
    reset_time: bool = False,
    schedulers: Any = None,
    scale_schedule_ratio: float = 1.0,
    step_schedulers_every_batch: Optional[bool] = None,
    eval_dataloader: Any = None,
    eval_subset_num_batches: int = -1,
    eval_interval: Any = 1,
    device_train_microbatch_size: Union[int, str, None] = None,
    precision: Any = None,
) -> FitChanges:
    """What ``fit``'s arguments change in the run whose state is ``state`` (see
    :meth:`~cadence.Trainer.fit`); ``state`` is only read.

    Args:
        state: the Trainer's state before the call.
        train_dataloader, train_dataloader_label, train_subset_num_batches, duration,
        reset_time, schedulers, scale_schedule_ratio, step_schedulers_every_batch,
        eval_dataloader, eval_subset_num_batches, eval_interval,
        device_train_microbatch_size, precision: ``fit()``'s arguments.

    Returns:
        The changes, for the Trainer to apply.

    Raises:
        ValueError: ``duration`` in ``dur``; no ``max_duration`` after all; a
            ``max_duration`` the run has already reached without ``reset_time`` (Composer's
            "The max_duration (...) is less than or equal to the elapsed training duration
            (...). No training would occur.": a finished run, autoresumed or fitted again);
            bad values (the message names the argument).
    """
    train_spec = None if train_dataloader is None else ensure_data_spec(train_dataloader)
    train_dataloader = None if train_spec is None else train_spec.dataloader
    length: Optional[int] = None
    set_length = train_dataloader is not None or train_subset_num_batches != -1
    if set_length:
        loader = train_dataloader if train_dataloader is not None else state.train_dataloader
        length = subset_len(dataloader_len(loader), train_subset_num_batches)
    max_duration = state.max_duration
    if duration is not None:
        duration = Time.from_input(duration, TimeUnit.EPOCH)
        if duration.unit == TimeUnit.DURATION:
            raise ValueError(f"fit(duration={duration}): a duration cannot be in 'dur'; use "
                             f"ep, ba, sp, tok or sec.")
        # train for `duration` more (from 0 after reset_time), as Composer does
        elapsed = 0 if reset_time else state.timestamp.get(duration.unit).value
        max_duration = Time(duration.value + elapsed, duration.unit)
    if max_duration is None:
        raise ValueError("fit() needs a duration: pass max_duration to the Trainer or "
                         "duration to fit().")
    unscaled_max = max_duration
    max_duration = scale_duration(max_duration, scale_schedule_ratio)
    precision_value = None if precision is None else Precision.parse(precision).value
    every_batch = None
    if schedulers is not None or step_schedulers_every_batch is not None:
        every_batch = steps_schedulers_every_batch(
            as_list(schedulers) if schedulers is not None else state.schedulers,
            step_schedulers_every_batch)
    auto_microbatch, microbatch_size = None, None
    if device_train_microbatch_size is not None:
        auto_microbatch = device_train_microbatch_size == "auto"
        if not auto_microbatch and (not isinstance(device_train_microbatch_size, int)
                                    or device_train_microbatch_size <= 0):
            raise ValueError(f"fit(device_train_microbatch_size=...) must be a positive int or "
                             f"'auto', got {device_train_microbatch_size!r}.")
        microbatch_size = None if auto_microbatch else device_train_microbatch_size
    with_eval = eval_dataloader is not None
    evaluators = as_evaluators(eval_dataloader) if with_eval else None
    interval = parse_eval_interval(eval_interval) if with_eval else None
    _check_training_would_occur(state, unscaled_max, reset_time)  # after the argument checks
    return FitChanges(
        train_dataloader=train_dataloader, train_data_spec=train_spec,
        train_dataloader_label=train_dataloader_label,
        set_dataloader_len=set_length, dataloader_len=length, reset_time=reset_time,
        max_duration=max_duration, scale_schedule_ratio=scale_schedule_ratio,
        schedulers=None if schedulers is None else as_list(schedulers),
        step_schedulers_every_batch=every_batch,
        evaluators=evaluators, eval_interval=interval,
        eval_subset_num_batches=int(eval_subset_num_batches) if with_eval else -1,
        auto_microbatch=auto_microbatch, device_train_microbatch_size=microbatch_size,
        precision=precision_value,
    )


def _check_training_would_occur(state: State, max_duration: Time, reset_time: bool) -> None:
    """Composer's check: ``fit`` on a run that has already reached ``max_duration``.

    Raises:
        ValueError: "The max_duration (...) is less than or equal to the elapsed training
            duration (...). No training would occur. ..." unless ``reset_time``.
    """
    if reset_time or max_duration.unit == TimeUnit.DURATION:
        return
    elapsed = state.timestamp.get(max_duration.unit)
    if max_duration <= elapsed:
        raise ValueError(
            f"The max_duration ({max_duration}) is less than or equal to the elapsed training "
            f"duration ({elapsed}). No training would occur. Pass fit(duration=...) to train "
            f"more, or fit(reset_time=True) to start the timestamp from 0.")
