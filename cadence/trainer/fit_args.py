"""The arguments of ``Trainer.fit`` (Composer's): what each changes before training starts.

Source: MosaicML Composer's ``Trainer.fit`` (``composer/trainer/trainer.py``): same names,
defaults and meaning. ``spin_dataloaders`` is accepted for Composer code: cadence resumes a
dataloader mid-epoch from the checkpoint's data position, which is what spinning achieved.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Optional, Union

import torch

from cadence.core import Time, TimeUnit, Timestamp
from cadence.trainer.eval_schedule import parse_eval_interval
from cadence.optim.optimizers import compile_scheduler
from cadence.parallel.data import (
    align_sampler_with_data_parallel, check_distributed_sampler,
)
from cadence.core.precision import Precision
from cadence.trainer.trainer_options import (
    scale_duration, steps_schedulers_every_batch, subset_len,
)

if TYPE_CHECKING:
    from cadence.trainer.trainer import Trainer

__all__ = ["apply_fit_arguments"]


def apply_fit_arguments(
    trainer: Trainer,
    *,
    train_dataloader: Optional[Iterable[Any]] = None,
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
) -> None:
    """Apply ``fit``'s arguments to ``trainer`` (see :meth:`~cadence.Trainer.fit`).

    Raises:
        ValueError: ``duration`` in ``dur``; no ``max_duration`` after all; bad values
            (the message names the argument).
    """
    from cadence.trainer.trainer_options import as_evaluators, as_list, dataloader_len

    state = trainer.state
    if train_dataloader is not None:
        check_distributed_sampler(train_dataloader, "train_dataloader")
        align_sampler_with_data_parallel(train_dataloader, "train_dataloader",
                                         trainer._dp_size, trainer._dp_rank)
        state.train_dataloader = train_dataloader
        state.set_dataloader(train_dataloader, train_dataloader_label)
        state.dataloader_len = subset_len(dataloader_len(train_dataloader),
                                        train_subset_num_batches)
        trainer.train_dataloader_label = train_dataloader_label
    elif train_subset_num_batches != -1:
        state.dataloader_len = subset_len(dataloader_len(state.train_dataloader),
                                        train_subset_num_batches)
    if reset_time:
        state.timestamp = Timestamp()
        state.previous_timestamp = None
    if duration is not None:
        duration = Time.from_input(duration, TimeUnit.EPOCH)
        if duration.unit == TimeUnit.DURATION:
            raise ValueError(f"fit(duration={duration}): a duration cannot be in 'dur'; use "
                             f"ep, ba, sp, tok or sec.")
        # train for `duration` more (from 0 after reset_time), as Composer does
        state.max_duration = Time(duration.value + state.timestamp.get(duration.unit).value,
                                  duration.unit)
    if state.max_duration is None:
        raise ValueError("fit() needs a duration: pass max_duration to the Trainer or "
                         "duration to fit().")
    if scale_schedule_ratio != 1.0:
        state.max_duration = scale_duration(state.max_duration, scale_schedule_ratio)
        trainer.scale_schedule_ratio = scale_schedule_ratio
    if schedulers is not None:
        state.schedulers = [compile_scheduler(s, state.optimizers[0], state, scale_schedule_ratio)
                            for s in as_list(schedulers)]
    if schedulers is not None or step_schedulers_every_batch is not None:
        trainer.step_schedulers_every_batch = steps_schedulers_every_batch(
            as_list(schedulers) if schedulers is not None else state.schedulers,
            step_schedulers_every_batch)
    if eval_dataloader is not None:
        state.evaluators = as_evaluators(eval_dataloader)
        trainer.eval_interval = parse_eval_interval(eval_interval)
        trainer.eval_subset_num_batches = int(eval_subset_num_batches)
        trainer._build_metrics()
    if device_train_microbatch_size is not None:
        trainer._auto_microbatch = device_train_microbatch_size == "auto"
        if not trainer._auto_microbatch and (not isinstance(device_train_microbatch_size, int)
                                             or device_train_microbatch_size <= 0):
            raise ValueError(f"fit(device_train_microbatch_size=...) must be a positive int or "
                             f"'auto', got {device_train_microbatch_size!r}.")
        state.device_train_microbatch_size = (None if trainer._auto_microbatch
                                              else device_train_microbatch_size)
    if precision is not None:
        state.precision = Precision.parse(precision).value
        trainer.grad_scaler = (torch.amp.GradScaler(state.device.type)
                               if state.precision == Precision.AMP_FP16.value else None)
