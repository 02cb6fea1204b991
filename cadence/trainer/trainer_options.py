"""Small pieces of the Trainer's argument handling that Composer users pass: the run name
from the environment, ``auto_log_hparams``, console output, ``train_subset_num_batches``,
``python_log_level``, ``deterministic_mode``, ``ddp_sync_strategy``,
``scale_schedule_ratio``, ``step_schedulers_every_batch``, ``profiler``, and the gradient
scaler that ``precision`` implies.

Source: the arguments of MosaicML Composer's ``Trainer`` (``composer/trainer/trainer.py``).
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from typing import Any, Iterable, Mapping, Optional, Sequence, TextIO, Union

import torch

from cadence.utils import dist
from cadence.core import Evaluator, Time, TimeUnit
from cadence.core.precision import Precision
from cadence.core.state import as_list
from cadence.trainer.trainer_config import LoggingConfig, RunConfig
from cadence.utils.reproducibility import configure_deterministic_mode

__all__ = [
    "EvalDataloader", "RUN_NAME_ENV_VARS", "agree_across_ranks",
    "apply_run_settings", "as_evaluators", "as_list", "excluded_algorithm_keys",
    "console_destinations", "dataloader_len", "extract_hparams", "grad_scaler_for",
    "profiler_callbacks", "checked_eval_subset",
    "check_model", "run_name_and_seed", "run_name_from_env", "parse_duration", "scale_duration", "steps_schedulers_every_batch",
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
        if dataloader_len(evaluator.dataloader.dataloader) == 0:
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


def run_name_and_seed(run_name: Optional[str], seed: Optional[int], autoresume: bool,
                      save_folder: Optional[str]) -> tuple[str, int]:
    """The run name (the argument, else :func:`run_name_from_env`, else a new one) and the
    rank-zero seed, the same on every rank (:func:`agree_across_ranks`).

    Raises:
        ValueError: ``autoresume`` without a ``save_folder`` or a named run (a default run
            name is new on every launch, so the run's checkpoints could not be found).
    """
    run_name = run_name or run_name_from_env()
    if autoresume and (save_folder is None or run_name is None):
        raise ValueError("autoresume=True needs save_folder and an explicit run_name (or "
                         "CADENCE_RUN_NAME), to find the run's checkpoints: a default run "
                         "name is new on every launch.")
    return agree_across_ranks(run_name, seed)


def check_model(model: Any) -> None:
    """Raises ``TypeError`` naming the missing method unless ``model`` has Composer's
    ``forward(batch)`` and ``loss(outputs, batch)``."""
    for method in ("forward", "loss"):
        if not callable(getattr(model, method, None)):
            raise TypeError(f"model must be a ComposerModel (with forward(batch) and "
                            f"loss(outputs, batch)); {type(model).__name__} has no {method}().")


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


def console_destinations(destinations: list[Any], settings: LoggingConfig,
                         log_interval: Time) -> list[Any]:
    """The destinations to add for console output (Composer's rules, cadence's terminal
    check), from the run's logging ``settings``.

    ``log_to_console=True`` adds a :class:`~cadence.loggers.ConsoleLogger` printing every
    ``console_log_interval`` (default ``log_interval``; an ``int`` is epochs, as in
    Composer) to ``console_stream``, unless ``destinations`` has one (a warning then says the
    console arguments are ignored). ``progress_bar=True`` adds the default progress
    destination (a bar when the stream is a terminal, else a ``ConsoleLogger``) unless
    ``destinations`` already has a progress destination; beside ``log_to_console`` only a
    bar is added, with a warning (both print, as in Composer).

    Raises:
        ValueError: ``console_stream`` is a string other than ``'stdout'``/``'stderr'``.
    """
    console_stream, log_traces = settings.console_stream, settings.log_traces
    log_to_console, progress_bar = settings.log_to_console, settings.progress_bar
    console_log_interval = settings.console_log_interval or log_interval
    from cadence.loggers import ConsoleLogger, ProgressBarLogger, default_progress_destination
    from cadence.loggers.console_logger import resolve_stream

    resolve_stream(console_stream, "console_stream")
    interval = Time.from_input(console_log_interval, TimeUnit.EPOCH)
    added: list[Any] = []
    if log_to_console:
        if any(isinstance(d, ConsoleLogger) for d in destinations):
            warnings.warn("loggers already holds a ConsoleLogger: log_to_console, "
                          "console_stream, console_log_interval and log_traces are ignored.")
        else:
            added.append(ConsoleLogger(log_interval=interval, stream=console_stream,
                                       log_traces=log_traces))
    if progress_bar and not any(getattr(d, "is_progress", False) for d in destinations):
        progress = default_progress_destination(True, interval, console_stream, log_traces)
        if log_to_console and isinstance(progress, ProgressBarLogger):
            warnings.warn("progress_bar=True with log_to_console=True prints both a progress "
                          "bar and console records; set one of them to False.")
            added.append(progress)
        elif not log_to_console and progress is not None:
            added.append(progress)
    return added


def profiler_callbacks(profiler: Any) -> list[Any]:
    """The callbacks a ``profiler`` argument adds: the profiler itself when it is a callback
    (Composer's :class:`~cadence.profiler.Profiler`, which the Trainer then binds to the
    state, cadence's :class:`~cadence.callbacks.profiler.ProfilerCallback`, or anything with
    ``run_event``), else none.

    Raises:
        TypeError: ``profiler`` is not a callback.
    """
    if profiler is None:
        return []
    if callable(getattr(profiler, "run_event", None)):
        return [profiler]
    raise TypeError(f"profiler must be a cadence.profiler.Profiler (or a callback), "
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


def apply_run_settings(run: RunConfig) -> str:
    """Apply Composer's process-wide Trainer settings (checked already, in ``run``) before
    anything is built: ``python_log_level`` (the ``cadence`` logger's level, with a plain
    stream handler when the process has none, as Composer does for ``composer``) and
    ``deterministic_mode``
    (:func:`~cadence.utils.reproducibility.configure_deterministic_mode`).

    Returns:
        The DDP gradient-sync strategy: ``ddp_sync_strategy``, default ``single_auto_sync``.
    """
    if run.python_log_level is not None:
        level = logging.getLevelName(str(run.python_log_level).upper())
        logging.basicConfig(format="%(asctime)s: rank%(process)d[%(threadName)s]: "
                                   "%(levelname)s: %(name)s: %(message)s")
        logging.getLogger("cadence").setLevel(level)
    if run.deterministic_mode:
        configure_deterministic_mode()
    return run.ddp_sync_strategy or "single_auto_sync"


def excluded_algorithm_keys(names: Optional[Sequence[str]]) -> list[str]:
    """``load_ignore_keys`` patterns that leave out the saved state of the algorithms named
    in ``load_exclude_algorithms`` (class names, e.g. ``["EMA"]``; a second instance of a
    class is saved as ``EMA#2``)."""
    return [pattern for name in (names or ())
            for pattern in (f"algorithms/{name}", f"algorithms/{name}#*")]
