"""Exponential moving average (EMA) of the model's weights, used for evaluation.

Every ``update_interval`` the EMA weights move towards the training weights::

    ema <- smoothing * ema + (1 - smoothing) * weights

with ``smoothing = 2 ** (-update_interval / half_life)`` (the EMA forgets half of its past
in ``half_life``), or a given ``smoothing``. Floating-point parameters and buffers are
averaged (BatchNorm statistics too); integer buffers (``num_batches_tracked``) are left
alone. The EMA starts as a copy of the weights at ``ema_start``.

Evaluation runs with the EMA weights: they are swapped into the model at
``EVAL_BEFORE_ALL`` and the training weights back at ``EVAL_AFTER_ALL``. At ``FIT_END`` the
EMA weights are swapped in and stay (the trained model *is* the EMA model, as in Composer);
a later ``fit()`` swaps the training weights back at ``FIT_START``. Under FSDP2 the EMA
copies are DTensors laid out like the parameters, and every update and swap works on the
local shards (no communication).

Source: Polyak & Juditsky, "Acceleration of stochastic approximation by averaging", 1992;
MosaicML Composer's ``EMA`` algorithm (``half_life``, ``smoothing``, ``update_interval``,
``ema_start``, evaluation with the EMA weights).
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Union

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from cadence.core import Algorithm, Event, State, Time, TimeUnit
from cadence.registry import algorithms
from cadence.utils.dtensor import local_tensor, shard_like
from cadence.utils.misc import unwrap_model

__all__ = ["EMA", "compute_ema", "smoothing_from_half_life"]

log = logging.getLogger(__name__)

_UNITS = (TimeUnit.BATCH, TimeUnit.EPOCH, TimeUnit.SAMPLE, TimeUnit.TOKEN)


def smoothing_from_half_life(half_life: Time, update_interval: Time) -> float:
    """``2 ** (-update_interval / half_life)``: the per-update smoothing that halves the
    weight of the past every ``half_life``.

    Raises:
        ValueError: the two are in different units, or ``half_life`` is zero.
    """
    if half_life.unit != update_interval.unit:
        raise ValueError(f"half_life ({half_life}) and update_interval ({update_interval}) must "
                         f"be in the same unit.")
    if half_life.value <= 0:
        raise ValueError(f"half_life must be > 0, got {half_life}.")
    return float(2.0 ** (-update_interval.value / half_life.value))


def compute_ema(model: nn.Module, ema_model: Union[nn.Module, dict[str, torch.Tensor]],
                smoothing: float = 0.99) -> None:
    """``ema <- smoothing * ema + (1 - smoothing) * model`` for every floating-point
    parameter and buffer, in place (DTensors on their local shards).

    Args:
        model: the unwrapped model (its ``named_parameters`` / ``named_buffers``).
        ema_model: a module of the same architecture (Composer's form: its parameters and
            buffers of the same names are updated), or name -> EMA tensor laid out like
            the model's tensor. Names that the model lacks are left alone.
        smoothing: in ``[0, 1]``; 0 copies the weights, 1 keeps the EMA. Default ``0.99``
            (Composer's).

    Raises:
        ValueError: ``smoothing`` outside ``[0, 1]``.

    Source: Composer ``composer/algorithms/ema/ema.py`` (``compute_ema``).
    """
    if not 0.0 <= smoothing <= 1.0:
        raise ValueError(f"smoothing must be in [0, 1], got {smoothing}.")
    ema = (_named_tensors(ema_model, include_frozen=True) if isinstance(ema_model, nn.Module)
           else ema_model)  # an EMA copy may have been frozen (requires_grad_(False))
    current = _named_tensors(model)
    names = [n for n in ema if n in current]
    with torch.no_grad():
        targets = [local_tensor(ema[n]) for n in names]
        sources = [local_tensor(current[n]).to(targets[i].dtype) for i, n in enumerate(names)]
        if targets:
            torch._foreach_lerp_(targets, sources, 1.0 - smoothing)


def _named_tensors(model: nn.Module, include_frozen: bool = False) -> dict[str, torch.Tensor]:
    """Trainable floating-point parameters and floating-point buffers by name (what the EMA
    averages; frozen parameters, e.g. a ``peft`` model's base, never change, so their average
    is themselves and is neither copied nor checkpointed).

    Under FSDP2 the model is resharded first: a root unit keeps its all-gathered parameters
    after an eval forward, and those copies are neither the sharded parameters nor
    refreshed before the next forward; after ``reshard()`` the sharded ones are registered
    again and the next forward all-gathers what the EMA wrote into them.
    """
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
    tensors = {n: p for n, p in model.named_parameters()
               if p.is_floating_point() and (p.requires_grad or include_frozen)}
    tensors.update({n: b for n, b in model.named_buffers() if b.is_floating_point()})
    return tensors


def _swap(model: nn.Module, other: dict[str, torch.Tensor]) -> None:
    """Exchange the model's values with ``other``'s, in place (storage stays where it is, so
    FSDP2's sharded parameters keep their identity)."""
    current = _named_tensors(model)
    with torch.no_grad():
        for name, stored in other.items():
            mine, theirs = local_tensor(current[name]), local_tensor(stored)
            kept = mine.detach().clone()
            mine.copy_(theirs)
            theirs.copy_(kept)


@algorithms.register("ema")
class EMA(Algorithm):
    """Keep an exponential moving average of the weights and evaluate with it.

    Args:
        half_life: the time in which the EMA forgets half its past (Time string, ``ba``,
            ``ep``, ``sp`` or ``tok``); default ``"1000ba"`` when ``smoothing`` is not set.
        smoothing: the per-update decay, in ``[0, 1)``; give this or ``half_life``.
        update_interval: how often the EMA is updated; default one unit of ``half_life``
            (``"1ba"`` with ``smoothing``). Must be in ``half_life``'s unit.
        ema_start: when the EMA starts (a copy of the weights then); default ``"0.0dur"``,
            the start of training. Any unit, ``dur`` included.

    State (checkpointed): ``shadow``, name -> tensor: the EMA weights while training (the
    training weights while the EMA ones are swapped into the model, after ``FIT_END``), laid
    out like the parameters (DTensors under FSDP2; ``full`` checkpoints hold full tensors and
    are re-sharded on load), plus ``ema_started``, ``ema_weights_active`` and the time of the
    last update.

    Example (YAML)::

        algorithms:
          ema: {half_life: 1000ba, ema_start: 0.1dur}

    Raises:
        ValueError: both ``half_life`` and ``smoothing``, a bad Time string, mismatched
            units, or a ``smoothing`` outside ``[0, 1)``.
    """

    events = frozenset({Event.BEFORE_LOAD, Event.FIT_START, Event.BATCH_END, Event.EPOCH_END,
                        Event.EVAL_BEFORE_ALL, Event.EVAL_AFTER_ALL, Event.FIT_END})

    def __init__(self, half_life: Optional[str] = None, smoothing: Optional[float] = None,
                 ema_start: str = "0.0dur", update_interval: Optional[str] = None) -> None:
        if half_life is not None and smoothing is not None:
            raise ValueError("Give either half_life or smoothing to EMA, not both.")
        if smoothing is not None and not 0.0 <= float(smoothing) < 1.0:
            raise ValueError(f"smoothing must be in [0, 1), got {smoothing!r}.")
        half = None if smoothing is not None else Time.from_input(half_life or "1000ba")
        if update_interval is not None:
            interval = Time.from_input(update_interval)
        else:
            interval = Time(1, half.unit if half is not None else TimeUnit.BATCH)
        for label, time in (("half_life", half), ("update_interval", interval)):
            if time is not None and time.unit not in _UNITS:
                raise ValueError(f"EMA {label} must be in ba, ep, sp or tok, got {time}.")
        if interval.value <= 0:
            raise ValueError(f"update_interval must be > 0, got {interval}.")
        self.half_life = half
        self.update_interval = interval
        self.smoothing = (float(smoothing) if smoothing is not None
                          else smoothing_from_half_life(half, interval))  # type: ignore[arg-type]
        self.ema_start = Time.from_input(ema_start)
        self.shadow: dict[str, torch.Tensor] = {}
        self.ema_started = False
        self.ema_weights_active = False
        self._active_before_eval = False
        self._last_update = -1  # update_interval's unit, at the last update
        self._model: Optional[nn.Module] = None
        self._pending: Optional[dict[str, Any]] = None

    # ------------------------------------------------------------------ events
    def match(self, event: Event, state: State) -> bool:
        return event in self.events

    def apply(self, event: Event, state: State, logger: Any) -> None:
        if self._model is None or event == Event.BEFORE_LOAD:
            self._bind(state)
        if event == Event.FIT_START:
            self._ensure_training_weights_active()
            self._maybe_start(state)
        elif event in (Event.BATCH_END, Event.EPOCH_END):
            self._maybe_start(state)
            if (event == Event.EPOCH_END) == (self.update_interval.unit == TimeUnit.EPOCH):
                self._maybe_update(state)
        elif event == Event.EVAL_BEFORE_ALL:
            self._active_before_eval = self.ema_weights_active
            self._ensure_ema_weights_active()
        elif event == Event.EVAL_AFTER_ALL:
            if not self._active_before_eval:
                self._ensure_training_weights_active()
        elif event == Event.FIT_END:
            self._ensure_ema_weights_active()

    def _bind(self, state: State) -> None:
        self._model = unwrap_model(state.model)
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self.load_state_dict(pending)

    def _maybe_start(self, state: State) -> None:
        if self.ema_started or not state.reached(self.ema_start):
            return
        assert self._model is not None
        with torch.no_grad():
            self.shadow = {n: t.detach().clone() for n, t in _named_tensors(self._model).items()}
        self.ema_started = True
        self._last_update = state.timestamp.get(self.update_interval.unit).value
        log.info("EMA: started at %s (smoothing %.6f per %s)", state.timestamp,
                 self.smoothing, self.update_interval)

    def _maybe_update(self, state: State) -> None:
        """Update when the timestamp crossed a multiple of ``update_interval`` since the last."""
        now = state.timestamp.get(self.update_interval.unit).value
        every = self.update_interval.value
        if self.ema_started and now // every > self._last_update // every:
            assert self._model is not None
            compute_ema(self._model, self.shadow, self.smoothing)
            self._last_update = now

    def _ensure_ema_weights_active(self) -> None:
        if self.ema_started and not self.ema_weights_active and self._model is not None:
            _swap(self._model, self.shadow)
            self.ema_weights_active = True

    def _ensure_training_weights_active(self) -> None:
        if self.ema_weights_active and self._model is not None:
            _swap(self._model, self.shadow)
            self.ema_weights_active = False

    @property
    def ema_weights(self) -> dict[str, torch.Tensor]:
        """name -> EMA weight (the model's own tensors while they are swapped in)."""
        if self.ema_weights_active and self._model is not None:
            current = _named_tensors(self._model)
            return {n: current[n].detach() for n in self.shadow}
        return dict(self.shadow)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """``shadow`` (see the class docstring), ``ema_started``, ``ema_weights_active`` and
        ``last_update``. Before the EMA starts, ``shadow`` holds zero placeholders laid out
        like the model's tensors, so a sharded checkpoint can be loaded into it."""
        shadow = self.shadow
        if not self.ema_started and self._model is not None:
            shadow = {n: torch.zeros_like(t) for n, t in _named_tensors(self._model).items()}
        return {"shadow": dict(shadow), "ema_started": self.ema_started,
                "ema_weights_active": self.ema_weights_active, "last_update": self._last_update}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; full tensors are re-sharded like the model's.

        Raises:
            ValueError: the checkpoint's EMA lacks a tensor of the model or has another shape.
        """
        if not state:
            return
        if self._model is None:  # loaded before the model was bound: finish at BEFORE_LOAD
            self._pending = dict(state)
            return
        self.ema_started = bool(state.get("ema_started", False))
        self.ema_weights_active = bool(state.get("ema_weights_active", False))
        self._last_update = int(state.get("last_update", -1))
        if not self.ema_started:
            self.shadow = {}
            return
        current = _named_tensors(self._model)
        saved = state.get("shadow", {})
        missing = sorted(set(current) - set(saved))
        if missing:
            raise ValueError(f"EMA: the checkpoint's EMA has no {missing[:5]}.")
        shadow = {}
        for name, tensor in current.items():
            try:
                shadow[name] = shard_like(tensor, saved[name], dtype=tensor.dtype)
            except ValueError as exc:
                raise ValueError(f"EMA: {name} in the checkpoint: {exc}.") from None
        self.shadow = shadow
