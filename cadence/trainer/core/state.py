"""The :class:`State` of a run: everything algorithms and callbacks may read.

Source: MosaicML Composer's ``State`` (``composer/core/state.py``), trimmed to what the
loop uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence

import torch

from cadence.trainer.core.time import Time, TimeUnit, Timestamp

__all__ = ["State", "Evaluator"]


@dataclass
class Evaluator:
    """A named eval dataloader and the metrics computed on it.

    Args:
        label: the name used in metric keys (``metrics/<label>/<MetricName>``); default ``eval``.
        dataloader: yields eval batches.
        metric_names: which of the model's ``get_metrics(is_train=False)`` to compute;
            ``None`` means all of them.
    """

    label: str
    dataloader: Iterable[Any]
    metric_names: Optional[Sequence[str]] = None


@dataclass
class State:
    """Everything about a run that algorithms and callbacks can see.

    Attributes:
        model: the :class:`~cadence.ComposerModel` (after parallelize: possibly DDP/FSDP wrapped).
        optimizers: the optimizers; most runs have one.
        schedulers: learning-rate schedulers, stepped once per batch.
        timestamp: where the run is (:class:`Timestamp`, global counts).
        max_duration: how long ``fit`` trains.
        rank_zero_seed: the seed on rank 0; rank ``r`` uses ``rank_zero_seed + r``.
        run_name: names the run in logs and checkpoint paths.
        save_folder: where the run writes its artifacts (metrics, checkpoints); may hold
            ``{run_name}``, filled in by the Trainer.
        device: the :class:`torch.device` the model runs on.
        precision: ``fp32``, ``amp_bf16`` or ``amp_fp16``.
        device_train_microbatch_size: samples per forward/backward; ``None`` for the whole batch.
        train_dataloader: yields training batches.
        evaluators: eval dataloaders with their metrics.
        batch: the current batch, or microbatch between ``BEFORE_FORWARD`` and ``AFTER_BACKWARD``.
        outputs: the model's outputs for the current (micro)batch.
        loss: the current microbatch's loss (scaled by its share of the batch), a tensor.
        total_loss: the batch's summed scaled loss, detached, kept on device (no host sync).
        train_metrics / eval_metrics: torchmetrics by name; ``eval_metrics`` keyed by evaluator label.
        algorithms / callbacks: as given to the Trainer.
        stop_training: a callback sets this to end ``fit`` after the current batch.
    """

    model: torch.nn.Module
    rank_zero_seed: int = 0
    run_name: str = "run"
    save_folder: Optional[str] = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    max_duration: Optional[Time] = None
    precision: str = "fp32"
    device_train_microbatch_size: Optional[int] = None
    optimizers: list[torch.optim.Optimizer] = field(default_factory=list)
    schedulers: list[Any] = field(default_factory=list)
    timestamp: Timestamp = field(default_factory=Timestamp)
    train_dataloader: Optional[Iterable[Any]] = None
    evaluators: list[Evaluator] = field(default_factory=list)
    algorithms: list[Any] = field(default_factory=list)
    callbacks: list[Any] = field(default_factory=list)
    batch: Any = None
    outputs: Any = None
    loss: Optional[torch.Tensor] = None
    total_loss: Optional[torch.Tensor] = None
    train_metrics: dict[str, Any] = field(default_factory=dict)
    eval_metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    dataloader_len: Optional[int] = None
    stop_training: bool = False

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The single optimizer (raises if there is not exactly one)."""
        if len(self.optimizers) != 1:
            raise ValueError(f"State has {len(self.optimizers)} optimizers; use state.optimizers.")
        return self.optimizers[0]

    def get_elapsed_duration(self) -> Optional[float]:
        """The fraction of ``max_duration`` elapsed, in ``[0, 1]``; ``None`` without one."""
        if self.max_duration is None:
            return None
        unit = self.max_duration.unit
        if unit == TimeUnit.DURATION:
            raise ValueError("max_duration cannot be given in 'dur'.")
        if unit == TimeUnit.EPOCH and self.dataloader_len:
            # Count partial epochs too, so 'dur' moves smoothly inside an epoch.
            done = self.timestamp.epoch + self.timestamp.batch_in_epoch / self.dataloader_len
            return done / self.max_duration.value
        return self.timestamp.get(unit).value / self.max_duration.value

    def to_time(self, time: Time) -> Time:
        """Convert a ``dur`` Time to ``max_duration``'s unit (other units pass through)."""
        if time.unit != TimeUnit.DURATION:
            return time
        if self.max_duration is None:
            raise ValueError(f"{time} is relative to max_duration, which is not set.")
        return Time(round(time.value * self.max_duration.value), self.max_duration.unit)

    def reached(self, time: Time) -> bool:
        """Whether the run's timestamp has reached ``time`` (``dur`` included)."""
        return self.timestamp >= self.to_time(time)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs: model, optimizers, schedulers, timestamp, algorithm and
        callback state, seed and run name. Tensors are returned as they are (no copy)."""
        return {
            "model": self.model.state_dict(),
            "optimizers": [opt.state_dict() for opt in self.optimizers],
            "schedulers": [sched.state_dict() for sched in self.schedulers],
            "timestamp": self.timestamp.state_dict(),
            "algorithms": [(type(a).__qualname__, a.state_dict()) for a in self.algorithms],
            "callbacks": [(type(c).__qualname__, c.state_dict()) for c in self.callbacks],
            "rank_zero_seed": self.rank_zero_seed,
            "run_name": self.run_name,
        }

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """Restore from :meth:`state_dict`.

        Raises:
            ValueError: the checkpoint's optimizers, schedulers, algorithms or callbacks do
                not line up with this run's (count or class).
        """
        self.model.load_state_dict(state["model"], strict=strict)
        for kind in ("optimizers", "schedulers"):
            mine, theirs = getattr(self, kind), state.get(kind, [])
            if len(mine) != len(theirs):
                raise ValueError(
                    f"Checkpoint has {len(theirs)} {kind}, this run has {len(mine)}; "
                    f"load with weights only to start them fresh."
                )
            for obj, sd in zip(mine, theirs):
                obj.load_state_dict(sd)
        self.timestamp = Timestamp.from_state_dict(state["timestamp"])
        for kind in ("algorithms", "callbacks"):
            mine = getattr(self, kind)
            saved = dict(state.get(kind, []))
            for obj in mine:
                key = type(obj).__qualname__
                if key in saved:
                    obj.load_state_dict(saved[key])
        self.rank_zero_seed = int(state.get("rank_zero_seed", self.rank_zero_seed))
