"""Stochastic Weight Averaging: the mean of the weights visited late in training.

Source: Izmailov et al., "Averaging Weights Leads to Wider Optima and Better
Generalization", UAI 2018 (https://arxiv.org/abs/1803.05407); PyTorch
``torch.optim.swa_utils`` (``AveragedModel``, ``SWALR``, ``update_bn``), which does the
averaging, the SWA learning rate and the BatchNorm statistics; MosaicML Composer's ``SWA``
(``composer/algorithms/swa/swa.py``), same arguments and defaults.
"""

from __future__ import annotations

import itertools
import logging
import warnings
from typing import Any, Iterator, Optional

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.optim.swa_utils import SWALR, AveragedModel, update_bn

from cadence.registry import algorithms
from cadence.core import Algorithm, Event, State, Time, TimeUnit
from cadence.core.data_spec import batch_to_device
from cadence.utils.misc import unwrap_model

__all__ = ["SWA"]

log = logging.getLogger(__name__)

_STRATEGIES = {"linear": "linear", "lin": "linear", "cos": "cos", "cosine": "cos"}


def _parse(name: str, value: str, units: tuple[TimeUnit, ...]) -> Time:
    try:
        time = Time.from_timestring(value) if isinstance(value, str) else Time.from_input(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}={value!r} is not a Time string such as '0.7dur' or "
                         f"'5ep': {exc}") from None
    if time.unit not in units:
        allowed = ", ".join(u.value for u in units)
        raise ValueError(f"{name}={value!r}: the unit must be one of {allowed}.")
    if time.unit == TimeUnit.DURATION and not 0 <= time.value <= 1:
        raise ValueError(f"{name}={value!r}: a duration must be within [0, 1].")
    return time


def _parameters(model: nn.Module) -> nn.ParameterList:
    """A view of ``model``'s parameters (the same tensors), without its buffers, hooks or
    attributes (a ComposerModel holds the run's logger): what the mean is taken of."""
    return nn.ParameterList(list(model.parameters()))


@algorithms.register("swa")
class SWA(Algorithm):
    """Stochastic Weight Averaging (Izmailov et al., UAI 2018).

    From ``swa_start`` on, every ``update_interval`` the model's parameters are added to a
    running mean (``torch.optim.swa_utils.AveragedModel``: ``avg <- avg + (w - avg) / (n +
    1)``, each tensor of the parameter's shape, kept on the CPU in the parameter's dtype).
    At ``swa_end`` the mean is copied into the model's parameters, and, if the model has
    BatchNorm layers, their running statistics are recomputed with one pass over the train
    dataloader (``torch.optim.swa_utils.update_bn``; RNG state untouched): statistics
    gathered for other weights do not fit the averaged ones. Training then goes on from the
    averaged weights until ``max_duration``.

    Runs at ``BATCH_END`` (``update_interval`` in batches) or ``EPOCH_END`` (in epochs).
    Doubles the memory of the parameters (in host memory). The running mean, its count,
    the counters and the SWA learning-rate scheduler are saved in checkpoints, so a resumed
    run continues exactly.

    Args:
        swa_start: when averaging starts, ``'dur'`` (fraction of ``max_duration``) or
            ``'ep'``. Default ``'0.7dur'``.
        swa_end: when the model takes the averaged weights; the same unit as ``swa_start``
            and later. Leave some training after it (``'1dur'`` warns). Default ``'0.97dur'``.
        update_interval: how often the mean takes the weights, ``'ba'`` or ``'ep'`` (a
            single-epoch run needs ``'ba'``). Default ``'1ep'``.
        schedule_swa_lr: also anneal the learning rate to ``swa_lr`` with ``SWALR`` while
            averaging (one step per update). Default False.
        anneal_strategy: ``'linear'`` (``'lin'``) or ``'cos'`` (``'cosine'``). Default
            ``'linear'``.
        anneal_steps: updates over which the learning rate anneals; > 0. Default 10.
        swa_lr: the learning rate annealed to; None: each group's learning rate when
            averaging starts. Default None.

    Raises:
        ValueError: a bad Time string or unit, ``swa_start >= swa_end``, a duration outside
            [0, 1], ``anneal_steps <= 0`` or an unknown ``anneal_strategy``; at the start of
            averaging, a model whose parameters are sharded (FSDP2).
        RuntimeError: ``schedule_swa_lr`` with more than one optimizer.

    Example (YAML)::

        algorithms:
          swa: {swa_start: 0.6dur, swa_end: 0.9dur, update_interval: 5ba}
    """

    events = frozenset({Event.BATCH_END, Event.EPOCH_END})

    def __init__(self, swa_start: str = "0.7dur", swa_end: str = "0.97dur",
                 update_interval: str = "1ep", schedule_swa_lr: bool = False,
                 anneal_strategy: str = "linear", anneal_steps: int = 10,
                 swa_lr: Optional[float] = None) -> None:
        units = (TimeUnit.DURATION, TimeUnit.EPOCH)
        self.swa_start = _parse("swa_start", swa_start, units)
        self.swa_end = _parse("swa_end", swa_end, units)
        self.update_interval = _parse("update_interval", update_interval,
                                      (TimeUnit.BATCH, TimeUnit.EPOCH))
        if self.swa_start.unit != self.swa_end.unit:
            raise ValueError(f"swa_start={swa_start!r} and swa_end={swa_end!r} must have the "
                             f"same unit.")
        if self.swa_start.value >= self.swa_end.value:
            raise ValueError(f"swa_end={swa_end!r} must be later than swa_start={swa_start!r}.")
        if self.update_interval.value <= 0:
            raise ValueError(f"update_interval={update_interval!r} must be > 0.")
        if self.swa_end.unit == TimeUnit.DURATION and self.swa_end.value == 1:
            warnings.warn("SWA(swa_end='1dur'): the averaged weights arrive when training "
                          "ends, so nothing trains on from them.")
        if anneal_steps <= 0:
            raise ValueError(f"anneal_steps must be > 0, got {anneal_steps}.")
        if str(anneal_strategy).lower() not in _STRATEGIES:
            raise ValueError(f"anneal_strategy={anneal_strategy!r} is not one of: linear, cos.")
        self.schedule_swa_lr = bool(schedule_swa_lr)
        self.anneal_strategy = _STRATEGIES[str(anneal_strategy).lower()]
        self.anneal_steps = int(anneal_steps)
        self.swa_lr = swa_lr
        self.match_event = (Event.BATCH_END if self.update_interval.unit == TimeUnit.BATCH
                            else Event.EPOCH_END)
        self.swa_model: Optional[AveragedModel] = None
        self.swa_scheduler: Optional[SWALR] = None
        self.swa_started = False
        self.swa_completed = False
        self.step_counter = 0
        self._pending: dict[str, Any] = {}  # a checkpoint's state, restored on first use

    # ------------------------------------------------------------------ events
    def _elapsed(self, state: State) -> Time:
        if self.swa_start.unit == TimeUnit.EPOCH:
            return state.timestamp.epoch
        elapsed = state.get_elapsed_duration()
        if elapsed is None:
            raise ValueError("SWA with swa_start/swa_end in 'dur' needs max_duration.")
        return elapsed

    def match(self, event: Event, state: State) -> bool:
        if event != self.match_event or self.swa_completed:
            return False
        return self._elapsed(state) >= self.swa_start

    def apply(self, event: Event, state: State, logger: Any) -> None:
        model = unwrap_model(state.model)
        if not self.swa_started:
            self._start(state, model)
        elif self.swa_model is None:  # resumed mid-average
            self._restore(state, model)
        if self.step_counter % self.update_interval.value == 0:
            assert self.swa_model is not None
            self.swa_model.update_parameters(_parameters(model))
            if self.swa_scheduler is not None:
                with warnings.catch_warnings():  # the optimizer stepped before SWALR was built
                    warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step",
                                            UserWarning)
                    self.swa_scheduler.step()
        self.step_counter += 1
        if self._elapsed(state) >= self.swa_end:
            self._finish(state, model)

    def _start(self, state: State, model: nn.Module) -> None:
        self.swa_model = self._new_average(model)
        self.swa_scheduler = self._new_scheduler(state)
        self.swa_started = True

    def _restore(self, state: State, model: nn.Module) -> None:
        self.swa_model = self._new_average(model)
        self.swa_model.load_state_dict(self._pending.pop("swa_model"))
        self.swa_scheduler = self._new_scheduler(state)
        saved = self._pending.pop("swa_scheduler", None)
        if self.swa_scheduler is not None and saved is not None:
            self.swa_scheduler.load_state_dict(saved)

    @staticmethod
    def _new_average(model: nn.Module) -> AveragedModel:
        if any(isinstance(p, DTensor) for p in model.parameters()):
            raise ValueError("SWA needs whole parameters on every rank; this model's are "
                             "sharded (FSDP2). Use DDP, or EMA, which supports FSDP2.")
        return AveragedModel(_parameters(model), device=torch.device("cpu"))

    def _new_scheduler(self, state: State) -> Optional[SWALR]:
        if not self.schedule_swa_lr:
            return None
        if len(state.optimizers) != 1:
            raise RuntimeError(f"SWA(schedule_swa_lr=True) supports one optimizer, got "
                               f"{len(state.optimizers)}.")
        optimizer = state.optimizers[0]
        swa_lr: Any = self.swa_lr
        if swa_lr is None:  # each group anneals towards its own learning rate now
            swa_lr = [group["lr"] for group in optimizer.param_groups]
        return SWALR(optimizer, swa_lr=swa_lr, anneal_epochs=self.anneal_steps,
                     anneal_strategy=self.anneal_strategy)

    @torch.no_grad()
    def _finish(self, state: State, model: nn.Module) -> None:
        assert self.swa_model is not None
        self.swa_completed = True
        for param, average in zip(model.parameters(), self.swa_model.module.parameters()):
            param.copy_(average)
        self._update_batchnorm(state, model)
        log.info("SWA: the model now holds the averaged weights (%d updates).",
                 int(self.swa_model.n_averaged))

    @staticmethod
    def _update_batchnorm(state: State, model: nn.Module) -> None:
        if not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
            return
        loader = state.train_dataloader
        if loader is None or getattr(loader, "persistent_workers", False):
            warnings.warn("SWA: BatchNorm statistics were not recomputed for the averaged "
                          "weights (no train dataloader, or one with persistent workers, "
                          "which a second pass would disturb); they adapt as training goes on.")
            return
        length = state.dataloader_len
        batches: Iterator[Any] = iter(loader)
        if length is not None:
            batches = itertools.islice(batches, int(length))
        devices = [state.device] if state.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):  # the run's RNG stream is unchanged
            # update_bn passes ``input[0]`` of a list to the model: the whole batch here
            update_bn(([batch_to_device(batch, state.device)] for batch in batches), model)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The running mean (``swa_model``: ``AveragedModel.state_dict()``, with
        ``n_averaged``), the SWA scheduler's state, ``swa_started``, ``swa_completed`` and
        ``step_counter``."""
        scheduler = None
        if self.swa_scheduler is not None:
            scheduler = {k: v for k, v in self.swa_scheduler.state_dict().items()
                         if k != "anneal_func"}  # a function; SWALR sets it itself
        average = self.swa_model.state_dict() if self.swa_model is not None else \
            self._pending.get("swa_model")
        return {"swa_model": average,
                "swa_scheduler": scheduler if scheduler is not None else
                self._pending.get("swa_scheduler"),
                "swa_started": self.swa_started, "swa_completed": self.swa_completed,
                "step_counter": self.step_counter}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; the mean and scheduler are rebuilt on the next
        update, around the run's own model and optimizer."""
        missing = {"swa_model", "swa_scheduler", "swa_started", "swa_completed",
                   "step_counter"} - set(state)
        if missing:
            raise ValueError(f"SWA.load_state_dict: missing keys {sorted(missing)}.")
        self.swa_started = bool(state["swa_started"])
        self.swa_completed = bool(state["swa_completed"])
        self.step_counter = int(state["step_counter"])
        self.swa_model = self.swa_scheduler = None
        self._pending = {k: state[k] for k in ("swa_model", "swa_scheduler")
                         if state[k] is not None}
