"""The :class:`State` of a run: everything algorithms and callbacks may read.

Source: MosaicML Composer's ``State`` (``composer/core/state.py``): same constructor
arguments (``State(model, rank_zero_seed, run_name, device, max_duration=..., dataloader=...,
dataloader_label=..., ...)``), so a Composer callback's test builds one the same way.

Differences from Composer, on purpose:

- ``state.device`` is a :class:`torch.device` (the constructor also takes a
  ``cadence.devices.Device``, ``"cpu"``, ``"gpu"`` or ``"cuda"``); the whole loop moves
  tensors with it directly.
- ``state.precision`` is the precision's string value (``"fp32"``, ``"amp_bf16"``), which
  compares equal to the ``Precision`` enum member.
- ``state.stop_training()`` (Composer's method) and ``state.stop_training = True`` (cadence's
  flag) both end ``fit`` after the current batch; ``bool(state.stop_training)`` says whether
  it was asked. Composer shrinks ``max_duration`` instead, which loses the planned length.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterable, Iterator, Optional, Sequence, Union

import torch

from cadence.core.batch_access import BatchKey, get_item, set_item
from cadence.core.evaluator import Evaluator
from cadence.core.time import Time, TimeUnit, Timestamp

__all__ = ["State", "fsdp_state_dict_type_context"]


@contextlib.contextmanager
def fsdp_state_dict_type_context(module: torch.nn.Module,
                                 state_dict_type: str = "full") -> Iterator[None]:
    """Composer's context for ``module.state_dict()`` under FSDP1 with a chosen layout.

    cadence shards with FSDP2, whose ``state_dict()`` always holds the DTensor shards: for
    ``"sharded"`` (and for a module that is not sharded at all, either type) the context
    changes nothing. A ``"full"`` state dict of a sharded module is refused: save a ``full``
    checkpoint (``save_checkpoint(state, filename)`` with ``state_dict_type: full``), or
    gather with ``torch.distributed.checkpoint.state_dict.get_model_state_dict(module,
    options=StateDictOptions(full_state_dict=True))``.

    Raises:
        NotImplementedError: ``state_dict_type`` is neither ``"full"`` nor ``"sharded"``
            (Composer's error), or ``"full"`` on a module with DTensor parameters.
    """
    if state_dict_type not in ("full", "sharded"):
        raise NotImplementedError(f"No valid FSDP state_dict_type for {state_dict_type!r}; "
                                  f"use 'full' or 'sharded'.")
    sharded = any(type(p).__name__ == "DTensor" for p in module.parameters())
    if sharded and state_dict_type == "full":
        raise NotImplementedError(
            "fsdp_state_dict_type_context(module, 'full') on an FSDP2-sharded module: its "
            "state_dict() holds DTensor shards and cannot be switched to a full one. Save a "
            "full checkpoint (FSDPConfig state_dict_type='full'), or gather with torch."
            "distributed.checkpoint.state_dict.get_model_state_dict(module, options="
            "StateDictOptions(full_state_dict=True, cpu_offload=True)).")
    yield


def as_list(value: Any) -> list[Any]:
    """``value`` as a list: ``[]`` for None, a list or tuple's items, else ``[value]``."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def _as_torch_device(device: Any) -> torch.device:
    """A ``torch.device`` from a ``torch.device``, a string or a ``cadence.devices.Device``."""
    if device is None:
        return torch.device("cpu")
    if isinstance(device, torch.device):
        return device
    if isinstance(device, str):
        return torch.device("cuda" if device == "gpu" else device)
    for attr in ("torch_device", "_device"):  # cadence.devices.Device (and Composer's)
        inner = getattr(device, attr, None)
        if isinstance(inner, torch.device):
            return inner
    raise TypeError(f"State(device=...) takes a torch.device, 'cpu', 'gpu' or a Device, got "
                    f"{type(device).__name__}.")


class _StopTraining:
    """``state.stop_training``: call it (Composer) or assign ``True`` (cadence); truthy once
    asked."""

    __slots__ = ("_state",)

    def __init__(self, state: State) -> None:
        self._state = state

    def __call__(self) -> None:
        """End ``fit`` after the current batch (Composer's ``State.stop_training()``)."""
        self._state._stop_training = True

    def __bool__(self) -> bool:
        return self._state._stop_training

    def __eq__(self, other: object) -> bool:
        return bool(self) == other if isinstance(other, bool) else NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<stop_training: {bool(self)}>"


#: What :meth:`State.state_dict` always writes (``serialized_attributes`` starts as these).
_SERIALIZED = ("model", "optimizers", "schedulers", "timestamp", "algorithms", "callbacks",
               "rank_zero_seed", "run_name")


def _saved(value: Any) -> Any:
    """An extra serialized attribute as saved: its ``state_dict()`` when it has one."""
    return value.state_dict() if hasattr(value, "state_dict") else value


class State:
    """Everything about a run that algorithms and callbacks can see.

    Args:
        model: the model (after parallelize: possibly DDP/FSDP wrapped).
        rank_zero_seed: the seed on rank 0; rank ``r`` uses ``rank_zero_seed + r``. Default 0.
        run_name: names the run in logs and checkpoint paths. Default ``"run"``.
        device: where the model runs: a ``torch.device``, ``"cpu"``/``"gpu"``/``"cuda"``, or a
            ``cadence.devices.Device``; stored as a ``torch.device``. Default CPU.
        max_duration: how long ``fit`` trains: a :class:`Time` or a time string (``"2ep"``,
            ``"100ba"``, ``"1e6tok"``, ``"3600sec"``); not ``dur``. Default ``None``.
        device_train_microbatch_size: samples per forward/backward; ``None``: the whole batch.
        auto_microbatching: whether the microbatch size is searched for (``'auto'``).
        train_dataloader: yields training batches.
        evaluators: an :class:`Evaluator` or a list of them.
        dataloader: the active dataloader (training or an evaluator's). Default: the train
            dataloader, labelled ``"train"``, as Composer's Trainer sets it.
        dataloader_label: the active dataloader's name; needed with ``dataloader``.
        dataloader_len: batches per epoch of the active dataloader: ``-1`` (default) for its
            ``len()`` (``None`` when it has none), or fewer to cut epochs short. Given
            without a dataloader (a test's State), it is taken as is.
        dataset_state / dataset_resumption: Composer's dataset resumption fields (stored).
        precision: ``"fp32"``, ``"amp_bf16"``, ``"amp_fp16"`` or a ``Precision``.
        precision_config: stored for Composer compatibility.
        optimizers: an optimizer or a list of them.
        scaler: the ``GradScaler`` for ``amp_fp16``, if any.
        save_metrics: stored for Composer compatibility.
        algorithms / callbacks: as given to the Trainer (one or a list).
        parallelism_config: the run's typed ``parallelism_config`` (a
            ``cadence.parallel.ParallelismConfig``; ``fsdp_config`` and ``tp_config`` read
            it), as the Trainer parsed it; ``None`` for a State built by hand.
        parallel_dims: the run's ``cadence.parallel.parallel_dims.ParallelDims`` (degrees,
            mesh, data-parallel group), set by the Trainer; ``None`` for a State built by hand.
        compile_config: the run's typed ``compile_config``, or ``None`` (no compile).
        save_folder: where the run writes its artifacts; may hold ``{run_name}``.
        schedulers: learning-rate schedulers (torch ``LRScheduler`` s), stepped per batch.
        timestamp: where training is (:class:`Timestamp`, global counts); default zero.
        train_metrics, eval_metrics, batch, outputs, loss, total_loss, stop_training: the
            attributes below, for a State built by hand (tests); defaults empty.

    Attributes:
        timestamp / eval_timestamp / predict_timestamp: where training, the current
            evaluation and the current prediction are (the eval/predict ones restart at
            each dataloader). ``previous_timestamp``: training's before the last batch.
        batch: the current batch, or microbatch between ``BEFORE_FORWARD`` and ``AFTER_BACKWARD``.
        outputs: the model's outputs for the current (micro)batch.
        loss: the current microbatch's loss (scaled by its share of the batch), a tensor.
        total_loss: the batch's summed scaled loss, detached, kept on device (no host sync).
        train_metrics / eval_metrics: torchmetrics by name; ``eval_metrics`` keyed by evaluator label.
        stop_training: ``state.stop_training()`` or ``state.stop_training = True`` ends
            ``fit`` after the current batch.
        profiler: the run's profiler, or ``None``.
        scaler: the ``torch.amp.GradScaler`` of an ``amp_fp16`` run on CUDA (the Trainer sets
            it after ``INIT``, and again when ``fit(precision=...)`` changes precision), else
            ``None``.
        auto_microbatching: whether ``device_train_microbatch_size='auto'`` searches for the
            microbatch size (``device_train_microbatch_size`` is then the size in use).
        fsdp_config / tp_config / device_mesh / fsdp_enabled / fsdp_state_dict_type /
            fsdp_sharded_state_dict_enabled / is_model_ddp / deepspeed_enabled: Composer's
            read-only views of ``parallelism_config``, ``parallel_dims`` and ``model``.
        load_path: the checkpoint this run loaded at start (Composer's), else ``None``.
        train_metric_values / eval_metric_values: the train metrics' values at the last log,
            and each eval metric's at the end of its evaluation, by metric name (Composer's).
        total_loss_dict: ``{"loss/train/total": loss}`` at the last log (Composer's; a 0-d
            tensor, the mean over the data-parallel ranks).
        metric_outputs: what an ``eval_forward`` returned for the metrics (Composer's; empty).
        deepspeed_config: always ``None`` (Composer's; cadence does not run DeepSpeed).
        serialized_attributes: the names of the attributes :meth:`state_dict` writes
            (Composer's attribute). Append a name to have that attribute saved and restored
            too (through its own ``state_dict``/``load_state_dict`` when it has them).

    Raises:
        ValueError: ``max_duration`` in ``dur``; ``dataloader`` without ``dataloader_label``.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        rank_zero_seed: int = 0,
        run_name: str = "run",
        device: Any = None,
        max_duration: Optional[Union[str, Time[int]]] = None,
        device_train_microbatch_size: Optional[Union[int, float]] = None,
        auto_microbatching: bool = False,
        train_dataloader: Optional[Iterable[Any]] = None,
        evaluators: Optional[Union[Evaluator, Sequence[Evaluator]]] = None,
        dataloader: Optional[Iterable[Any]] = None,
        dataloader_label: Optional[str] = None,
        dataloader_len: Optional[Union[int, Time[int]]] = -1,
        dataset_state: Optional[dict[str, Any]] = None,
        dataset_resumption: Optional[dict[str, Any]] = None,
        precision: Any = "fp32",
        precision_config: Optional[dict[str, Any]] = None,
        optimizers: Optional[Union[torch.optim.Optimizer, Sequence[torch.optim.Optimizer]]] = None,
        scaler: Optional[Any] = None,
        save_metrics: bool = False,
        algorithms: Any = None,
        callbacks: Any = None,
        parallelism_config: Optional[Any] = None,
        *,
        parallel_dims: Optional[Any] = None,
        compile_config: Optional[Any] = None,
        save_folder: Optional[str] = None,
        schedulers: Any = None,
        timestamp: Optional[Timestamp] = None,
        train_metrics: Optional[dict[str, Any]] = None,
        eval_metrics: Optional[dict[str, dict[str, Any]]] = None,
        batch: Any = None,
        outputs: Any = None,
        loss: Optional[torch.Tensor] = None,
        total_loss: Optional[torch.Tensor] = None,
        stop_training: bool = False,
    ) -> None:
        self.model = model
        self.rank_zero_seed = rank_zero_seed
        self.run_name = run_name
        self.device = _as_torch_device(device)
        self.save_folder = save_folder
        self._max_duration: Optional[Time] = None
        self.max_duration = max_duration  # type: ignore[assignment]
        self.device_train_microbatch_size = device_train_microbatch_size
        self.auto_microbatching = auto_microbatching
        self.precision = str(getattr(precision, "value", precision))
        self.precision_config = precision_config
        self.parallelism_config = parallelism_config
        self.parallel_dims = parallel_dims
        self.compile_config = compile_config
        self.load_path: Optional[str] = None
        self.scaler = scaler
        self.save_metrics = save_metrics
        self.dataset_state = dataset_state
        self.dataset_resumption = dataset_resumption or {}
        self.train_dataloader = train_dataloader
        self._evaluators: list[Evaluator] = as_list(evaluators)
        self._dataloader: Optional[Iterable[Any]] = None
        self._dataloader_label: Optional[str] = None
        self._dataloader_len: Optional[Time] = None
        if dataloader is None and train_dataloader is not None:
            dataloader, dataloader_label = train_dataloader, dataloader_label or "train"
        if dataloader is not None:
            self.set_dataloader(dataloader, dataloader_label, dataloader_len)
        elif dataloader_len is not None and dataloader_len != -1:
            self._dataloader_len = Time.from_input(dataloader_len, TimeUnit.BATCH)
        self._optimizers: list[torch.optim.Optimizer] = as_list(optimizers)
        self._schedulers: list[Any] = as_list(schedulers)
        self.algorithms = algorithms
        self.callbacks: list[Any] = as_list(callbacks)
        self.timestamp = Timestamp() if timestamp is None else timestamp
        self.previous_timestamp: Optional[Timestamp] = None
        self.eval_timestamp = Timestamp()
        self.predict_timestamp = Timestamp()
        self.profiler: Optional[Any] = None
        self.batch: Any = batch
        self.outputs: Any = outputs
        self.loss: Optional[torch.Tensor] = loss
        self.total_loss: Optional[torch.Tensor] = total_loss
        self.train_metrics: dict[str, Any] = dict(train_metrics or {})
        self.eval_metrics: dict[str, dict[str, Any]] = dict(eval_metrics or {})
        self._stop_training = bool(stop_training)
        self.train_metric_values: dict[str, Any] = {}
        self.eval_metric_values: dict[str, Any] = {}
        self.total_loss_dict: dict[str, Any] = {}
        self.metric_outputs: dict[str, Any] = {}
        self.deepspeed_config: Optional[dict[str, Any]] = None
        self.serialized_attributes: list[str] = list(_SERIALIZED)

    # ------------------------------------------------------------------ batch
    def batch_get_item(self, key: BatchKey) -> Any:
        """The part of ``state.batch`` that ``key`` names (Composer's): an index, a mapping key
        or attribute name, a sequence of them, a getter ``batch -> value``, or a
        ``(getter, setter)`` pair (see :mod:`cadence.utils.batch_helpers`).

        Raises:
            KeyError, IndexError, AttributeError: ``key`` names nothing in the batch.
        """
        return get_item(self.batch, key)

    def batch_set_item(self, key: BatchKey, value: Any) -> None:
        """Set the part of ``state.batch`` that ``key`` names to ``value`` (Composer's); a
        tuple batch is replaced by a new tuple.

        Raises:
            KeyError, IndexError: ``key`` is not already in the batch.
            RuntimeError: the batch has neither such an item nor such an attribute.
        """
        self.batch = set_item(self.batch, key, value)

    # ------------------------------------------------------------------ properties
    # Composer's setters: one optimizer, scheduler or evaluator may be assigned alone.
    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The optimizers (a list; assign one or a sequence)."""
        return self._optimizers

    @optimizers.setter
    def optimizers(self, optimizers: Any) -> None:
        self._optimizers = as_list(optimizers)

    @property
    def schedulers(self) -> list[Any]:
        """The learning-rate schedulers (a list; assign one or a sequence)."""
        return self._schedulers

    @schedulers.setter
    def schedulers(self, schedulers: Any) -> None:
        self._schedulers = as_list(schedulers)

    @property
    def evaluators(self) -> list[Evaluator]:
        """The evaluators (a list; assign one or a sequence)."""
        return self._evaluators

    @evaluators.setter
    def evaluators(self, evaluators: Any) -> None:
        self._evaluators = as_list(evaluators)

    @property
    def max_duration(self) -> Optional[Time[int]]:
        """How long ``fit`` trains, a :class:`Time` (set it with a Time or a time string)."""
        return self._max_duration

    @max_duration.setter
    def max_duration(self, max_duration: Optional[Union[str, Time[int]]]) -> None:
        if max_duration is None:
            self._max_duration = None
            return
        duration = Time.from_input(max_duration, TimeUnit.EPOCH)
        if duration.unit == TimeUnit.DURATION:
            raise ValueError(f"max_duration cannot be in 'dur' ({duration}); use ep, ba, sp, "
                             f"tok or sec.")
        self._max_duration = duration

    @property
    def dataloader(self) -> Optional[Iterable[Any]]:
        """The active dataloader (training, or an evaluator's during eval)."""
        return self._dataloader

    @property
    def dataloader_label(self) -> Optional[str]:
        """The active dataloader's label (``"train"``, or the evaluator's label)."""
        return self._dataloader_label

    @property
    def dataloader_len(self) -> Optional[Time[int]]:
        """Batches per epoch of the active dataloader, a ``ba`` :class:`Time`; ``None`` when
        unknown (an unsized iterable)."""
        return self._dataloader_len

    @dataloader_len.setter
    def dataloader_len(self, num_batches: Optional[Union[int, Time[int]]]) -> None:
        if num_batches is None:
            self._dataloader_len = None
            return
        num_batches = Time.from_input(num_batches, TimeUnit.BATCH)
        if num_batches.unit != TimeUnit.BATCH:
            raise ValueError(f"dataloader_len must be in batches, got {num_batches}.")
        length: Optional[int]
        try:
            length = len(self._dataloader)  # type: ignore[arg-type]
        except (TypeError, NotImplementedError):
            length = None
        if num_batches.value < 0:
            self._dataloader_len = None if length is None else Time(length, TimeUnit.BATCH)
        elif length is not None and num_batches.value > length:
            self._dataloader_len = Time(length, TimeUnit.BATCH)  # cannot exceed the dataloader
        else:
            self._dataloader_len = num_batches

    def set_dataloader(self, dataloader: Optional[Iterable[Any]] = None,
                       dataloader_label: Optional[str] = None,
                       dataloader_len: Union[int, Time[int]] = -1) -> None:
        """Make ``dataloader`` the active one (Composer's ``State.set_dataloader``).

        Args:
            dataloader: the dataloader; ``None`` clears it (and its label and length).
            dataloader_label: its name (``"train"``, an evaluator's label); needed with a
                dataloader.
            dataloader_len: batches to take per epoch; ``-1`` for its ``len()``.

        Raises:
            ValueError: a dataloader without a label.
        """
        if dataloader is None:
            self._dataloader = self._dataloader_label = self._dataloader_len = None
            return
        if dataloader_label is None:
            raise ValueError("set_dataloader(dataloader, dataloader_label): a dataloader needs "
                             "a label, e.g. 'train' or the evaluator's label.")
        self._dataloader, self._dataloader_label = dataloader, dataloader_label
        self.dataloader_len = dataloader_len

    @property
    def algorithms(self) -> list[Any]:
        """The run's algorithms, a list (Composer keeps them in ``state._algorithms``, which
        its tests assign; both names are the same list here)."""
        return self._algorithms

    @algorithms.setter
    def algorithms(self, value: Any) -> None:
        self._algorithms = as_list(value)

    @property
    def stop_training(self) -> _StopTraining:
        """Call it (``state.stop_training()``) or set it to ``True`` to end ``fit`` after the
        current batch; truthy once asked. ``fit`` resets it when it starts."""
        return _StopTraining(self)

    @stop_training.setter
    def stop_training(self, value: bool) -> None:
        self._stop_training = bool(value)

    @property
    def seed(self) -> int:
        """This rank's seed: ``rank_zero_seed + rank`` (rank from the ``RANK`` environment)."""
        return self.rank_zero_seed + int(os.environ.get("RANK", "0"))

    # ------------------------------------------------------------------ parallelism (Composer's)
    @property
    def fsdp_config(self) -> Optional[Any]:
        """``parallelism_config.fsdp`` (an ``FSDPConfig``), or ``None`` without FSDP."""
        return getattr(self.parallelism_config, "fsdp", None)

    @property
    def tp_config(self) -> Optional[Any]:
        """``parallelism_config.tp`` (a ``TPConfig``), or ``None`` without tensor parallelism."""
        return getattr(self.parallelism_config, "tp", None)

    @property
    def fsdp_enabled(self) -> bool:
        """Whether FSDP2 shards the model."""
        return self.fsdp_config is not None

    @property
    def fsdp_state_dict_type(self) -> Optional[str]:
        """The fsdp config's ``state_dict_type`` (``full`` or ``sharded``); ``None`` without
        FSDP."""
        return None if self.fsdp_config is None else self.fsdp_config.state_dict_type

    @property
    def fsdp_sharded_state_dict_enabled(self) -> bool:
        """Whether checkpoints are sharded (FSDP with ``state_dict_type: sharded``)."""
        return self.fsdp_state_dict_type == "sharded"

    @property
    def device_mesh(self) -> Optional[Any]:
        """The run's ``DeviceMesh`` (FSDP2 / TP), or ``None`` when nothing shards the model."""
        return None if self.parallel_dims is None else self.parallel_dims.mesh

    @property
    def is_model_ddp(self) -> bool:
        """Whether the model is wrapped in ``DistributedDataParallel``."""
        return isinstance(self.model, torch.nn.parallel.DistributedDataParallel)

    @property
    def deepspeed_enabled(self) -> bool:
        """Always False: cadence does not run DeepSpeed (Composer's attribute)."""
        return False

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The single optimizer (raises if there is not exactly one)."""
        if len(self.optimizers) != 1:
            raise ValueError(f"State has {len(self.optimizers)} optimizers; use state.optimizers.")
        return self.optimizers[0]

    # ------------------------------------------------------------------ time
    def get_elapsed_duration(self) -> Optional[Time[float]]:
        """The fraction of ``max_duration`` elapsed, a ``dur`` :class:`Time` (compare it
        with floats: ``state.get_elapsed_duration() >= 0.5``); ``None`` without one.

        With ``max_duration`` in epochs and a known ``dataloader_len``, the epoch in progress
        counts by its batches, so the fraction moves smoothly inside an epoch (Composer
        counts whole epochs only).
        """
        if self.max_duration is None:
            return None
        unit = self.max_duration.unit
        total = self.max_duration.value
        if unit == TimeUnit.EPOCH and self._dataloader_len:
            done = (self.timestamp.epoch.value
                    + self.timestamp.batch_in_epoch.value / self._dataloader_len.value)
            return Time(done / total, TimeUnit.DURATION)
        return Time(self.timestamp.get(unit).value / total, TimeUnit.DURATION)

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

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs: model, optimizers, schedulers, timestamp, algorithm and
        callback state, seed and run name. Tensors are returned as they are (no copy)."""
        extra = {name: _saved(getattr(self, name)) for name in self.serialized_attributes
                 if name not in _SERIALIZED and hasattr(self, name)}
        return {
            **extra,
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
        for name in self.serialized_attributes:
            if name not in _SERIALIZED and name in state:
                current = getattr(self, name, None)
                if hasattr(current, "load_state_dict"):
                    current.load_state_dict(state[name])
                else:
                    setattr(self, name, state[name])
