"""Small pieces of the Trainer's argument handling that Composer users pass: the run name
from the environment, ``auto_log_hparams``, console output, ``train_subset_num_batches``,
``scale_schedule_ratio``, ``step_schedulers_every_batch``, ``profiler``, and the gradient
scaler that ``precision`` implies.

Source: the arguments of MosaicML Composer's ``Trainer`` (``composer/trainer/trainer.py``).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Iterable, Mapping, Optional, Sequence, TextIO, Union

import torch

from cadence.utils import dist
from cadence.core import Evaluator, Time, TimeUnit
from cadence.core.precision import Precision
from cadence.core.state import as_list

__all__ = [
    "EvalDataloader", "RUN_NAME_ENV_VARS", "agree_across_ranks", "as_evaluators", "as_list",
    "console_destinations", "dataloader_len", "extract_hparams", "grad_scaler_for",
    "profiler_callbacks", "checked_save_interval", "checked_eval_subset",
    "run_name_from_env", "parse_duration", "scale_duration", "steps_schedulers_every_batch",
    "subset_len",
]

EvalDataloader = Union[Iterable[Any], Evaluator, Sequence[Evaluator]]


def as_evaluators(eval_dataloader: Optional[EvalDataloader]) -> list[Evaluator]:
    """A dataloader (labelled ``eval``), an Evaluator or a list of Evaluators, as a list.

    Raises:
        ValueError: an evaluator's dataloader has no batches, or its ``subset_num_batches``
            is 0 (its metrics would be NaN on every evaluation): refused at start.
    """
    if eval_dataloader is None:
        return []
    if isinstance(eval_dataloader, Evaluator):
        evaluators = [eval_dataloader]
    elif isinstance(eval_dataloader, (list, tuple)) and all(
        isinstance(e, Evaluator) for e in eval_dataloader
    ):
        evaluators = list(eval_dataloader)
    else:
        evaluators = [Evaluator(label="eval", dataloader=eval_dataloader)]
    for evaluator in evaluators:
        if dataloader_len(evaluator.dataloader) == 0:
            raise ValueError(f"eval dataloader {evaluator.label!r} has no batches on rank "
                             f"{dist.get_global_rank()}: its metrics would be NaN. Give it "
                             f"data (fewer ranks, a smaller device_eval_batch_size, "
                             f"drop_last=False), or leave eval_dataloader out.")
        checked_eval_subset(getattr(evaluator, "subset_num_batches", None),
                            f"Evaluator {evaluator.label!r} subset_num_batches")
    return evaluators


def checked_eval_subset(subset_num_batches: Optional[int],
                        name: str = "eval_subset_num_batches") -> Optional[int]:
    """``subset_num_batches`` as given, once known to be -1 (all), ``None`` or positive.

    Raises:
        ValueError: 0 (nothing would be evaluated: NaN metrics) or below -1.
    """
    if subset_num_batches is None or subset_num_batches == -1 or subset_num_batches >= 1:
        return subset_num_batches
    raise ValueError(f"{name}={subset_num_batches!r} would evaluate "
                     f"{'no batches (NaN metrics)' if subset_num_batches == 0 else 'nothing'}; "
                     f"use -1 (every batch) or a positive number of batches.")


def dataloader_len(dataloader: Any) -> Optional[int]:
    """``len(dataloader)`` in batches, or None for an unsized iterable."""
    try:
        return len(dataloader)
    except TypeError:
        return None


def agree_across_ranks(run_name: Optional[str], seed: Optional[int]) -> tuple[str, int]:
    """The run name and seed, defaulted on rank 0 (time, random) and shared with every rank."""
    chosen = [run_name or f"run-{int(time.time())}",
              int.from_bytes(os.urandom(4), "little") % (2**31) if seed is None else int(seed)]
    if dist.get_world_size() > 1 and (run_name is None or seed is None):
        dist.broadcast_object_list(chosen, src=0)
    return chosen[0], chosen[1]


#: Read in this order when no ``run_name`` is given: cadence's, then Composer's two.
RUN_NAME_ENV_VARS = ("CADENCE_RUN_NAME", "COMPOSER_RUN_NAME", "RUN_NAME")


def run_name_from_env() -> Optional[str]:
    """The run name from ``CADENCE_RUN_NAME``, ``COMPOSER_RUN_NAME`` or ``RUN_NAME`` (the
    first set and non-empty), else None."""
    for name in RUN_NAME_ENV_VARS:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return None


def _hparam(value: Any) -> Any:
    """A loggable form of an argument: numbers, strings, None and bools as they are, Times as
    strings, containers item by item, anything else by its class name."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Time):
        return str(value)
    if isinstance(value, torch.device):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _hparam(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_hparam(v) for v in value]
    return type(value).__name__


def extract_hparams(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The Trainer's arguments as hyperparameters (``auto_log_hparams=True``), as Composer's
    ``extract_hparams``: objects (model, dataloaders, optimizers, callbacks) appear by
    class name, plain values as they are."""
    return {name: _hparam(value) for name, value in arguments.items()
            if name not in ("self", "hyperparameters") and not name.startswith("_")}


def subset_len(length: Optional[int], subset_num_batches: int) -> Optional[int]:
    """The batches per epoch with ``train_subset_num_batches`` (``-1``: the dataloader's
    length; with an unsized dataloader, the subset is the epoch's length).

    Raises:
        ValueError: ``subset_num_batches`` is 0 or below -1.
    """
    if subset_num_batches == -1:
        return length
    if not isinstance(subset_num_batches, int) or subset_num_batches < 1:
        raise ValueError(f"train_subset_num_batches must be -1 (all) or a positive int, got "
                         f"{subset_num_batches!r}.")
    return subset_num_batches if length is None else min(int(length), subset_num_batches)


def checked_save_interval(save_interval: Any) -> Any:
    """``save_interval`` as given, once it is known not to be negative (a negative interval
    never fires: only the final checkpoint would be written, silently). ``None`` and
    callables pass; ``0`` saves only when training ends.

    Raises:
        ValueError: a negative interval, or one that is not a Time (naming the argument).
    """
    if save_interval is None or callable(save_interval):
        return save_interval
    try:
        time = Time.from_input(save_interval, TimeUnit.EPOCH)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"save_interval={save_interval!r} is neither a Time (e.g. '1ep', "
                         f"'500ba') nor a callable (state, event) -> bool: {exc}") from None
    if time.value < 0:
        raise ValueError(f"save_interval={save_interval!r} is negative; use a positive Time such "
                         f"as '1ep' or '500ba' (save_interval=None turns checkpoints off).")
    return save_interval


def scale_duration(duration: Optional[Time], ratio: float) -> Optional[Time]:
    """``max_duration`` scaled by ``scale_schedule_ratio`` (Composer: ``int(value * ratio)``).

    Raises:
        ValueError: a ratio that is not positive.
    """
    if ratio <= 0:
        raise ValueError(f"scale_schedule_ratio must be > 0, got {ratio}.")
    if duration is None or ratio == 1.0:
        return duration
    return Time(int(duration.value * ratio), duration.unit)


def steps_schedulers_every_batch(schedulers: list[Any], every_batch: Optional[bool]) -> bool:
    """Whether schedulers step after every batch (else after every epoch). ``None`` is
    Composer's default: every batch, unless a scheduler is a torch ``LRScheduler`` (whose
    arguments count epochs), then every epoch."""
    if every_batch is not None:
        return bool(every_batch)
    return not any(isinstance(s, torch.optim.lr_scheduler.LRScheduler) for s in schedulers)


def grad_scaler_for(precision: Union[str, Precision],
                    device: torch.device) -> Optional[torch.amp.GradScaler]:
    """The gradient scaler a run in ``precision`` needs: a ``torch.amp.GradScaler`` on
    ``device``'s type for ``amp_fp16`` (float16 gradients underflow without loss scaling),
    else None.

    Args:
        precision: the run's precision (a :class:`~cadence.core.precision.Precision` or its
            value).
        device: the run's device.

    Returns:
        A new scaler, or None.

    Raises:
        ValueError: an unknown precision.
    """
    if Precision.parse(precision) != Precision.AMP_FP16:
        return None
    return torch.amp.GradScaler(device.type)


def _stream(console_stream: Union[str, TextIO, None]) -> Optional[TextIO]:
    if console_stream is None or not isinstance(console_stream, str):
        return console_stream
    streams = {"stdout": sys.stdout, "stderr": sys.stderr}
    if console_stream not in streams:
        raise ValueError(f"console_stream must be 'stdout', 'stderr' or a stream, got "
                         f"{console_stream!r}.")
    return streams[console_stream]


def console_destinations(destinations: list[Any], progress_bar: bool, log_to_console: bool,
                         console_stream: Union[str, TextIO, None],
                         console_log_interval: Union[int, str, Time]) -> list[Any]:
    """The destinations to add for console output.

    ``log_to_console=True`` adds a :class:`~cadence.loggers.ConsoleLogger` printing
    every ``console_log_interval`` to ``console_stream``; otherwise, with ``progress_bar``,
    the default progress destination (a bar on a terminal, plain lines elsewhere). Nothing
    is added when ``destinations`` already has a progress destination.
    """
    if any(getattr(d, "is_progress", False) for d in destinations):
        return []
    from cadence.loggers import ConsoleLogger, default_progress_destination

    interval = Time.from_input(console_log_interval, TimeUnit.BATCH)
    if log_to_console:
        return [ConsoleLogger(log_interval=interval, stream=_stream(console_stream))]
    progress = default_progress_destination(progress_bar, interval, _stream(console_stream))
    return [] if progress is None else [progress]


def profiler_callbacks(profiler: Any) -> list[Any]:
    """The callbacks a ``profiler`` argument adds: the profiler itself when it is a callback
    (cadence's :class:`~cadence.callbacks.profiler.ProfilerCallback`, or anything with
    ``run_event``), else none.

    Raises:
        TypeError: ``profiler`` is not a callback.
    """
    if profiler is None:
        return []
    if callable(getattr(profiler, "run_event", None)):
        return [profiler]
    raise TypeError(f"profiler must be a callback (e.g. cadence.callbacks.ProfilerCallback), "
                    f"got {type(profiler).__name__}.")


def parse_duration(max_duration: Any) -> Optional[Time]:
    """``max_duration`` as a :class:`~cadence.Time` (an int means epochs), or None.

    Raises:
        ValueError: a duration in ``dur`` or ``iter``; names the units allowed.
    """
    if max_duration is None:
        return None
    duration = Time.from_input(max_duration, TimeUnit.EPOCH)
    if duration.unit in (TimeUnit.DURATION, TimeUnit.ITERATION):
        raise ValueError(f"max_duration cannot be in '{duration.unit.value}' ({duration}); use "
                         f"ep, ba, sp, tok or sec.")
    return duration
