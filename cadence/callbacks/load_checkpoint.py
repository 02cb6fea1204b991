"""The :class:`LoadCheckpoint` callback: load a checkpoint into the run at a chosen event.

Source: MosaicML Composer's ``LoadCheckpoint`` (``composer/callbacks/load_checkpoint.py``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Optional, Union

from cadence.registry import callbacks
from cadence.core import Callback, Event

if TYPE_CHECKING:
    from cadence.core import State

__all__ = ["LoadCheckpoint"]

log = logging.getLogger(__name__)


def _event(event: Union[str, Event]) -> Event:
    if isinstance(event, Event):
        return event
    text = str(event)
    for candidate in Event:
        if text.lower() in (candidate.value.lower(), candidate.name.lower()):
            return candidate
    raise ValueError(f"LoadCheckpoint event {event!r} is not an Event; use one of "
                     f"{[e.value for e in Event]} (e.g. 'before_load', 'fit_start').")


@callbacks.register("load_checkpoint")
class LoadCheckpoint(Callback):
    """Loads the checkpoint at ``load_path`` into the run when ``event`` fires: e.g. the
    weights of a pretrained run at ``BEFORE_LOAD`` (before the Trainer's own ``load_path``
    or autoresume, which then win), or at ``FIT_START`` of a second ``fit``.

    Loading goes through :func:`cadence.utils.checkpoint.load_checkpoint`: every file is
    checked against its checksums before any tensor is used, and a checkpoint saved on
    another number of ranks loads. A model with ``should_save_peft_only`` set (adapters)
    gets its full weights loaded; the flag is put back afterwards (as Composer does).

    Args:
        load_path: the checkpoint: a ``full`` ``.pt`` file or a sharded directory, a local
            path or an fsspec URL (``s3://bucket/run/ep1-ba8-rank0.pt``).
        load_weights_only: load the model's weights only (not the optimizer, schedulers,
            timestamp or RNG). Default False.
        strict_model_weights: the model's keys must match the checkpoint's. Default True.
        ignore_keys: glob patterns of what not to load (e.g. ``["model/head.*"]``; Composer's
            ``state/...`` spellings are accepted). Default none.
        event: when to load: an :class:`~cadence.core.Event` or its name (``'before_load'``,
            ``'BEFORE_LOAD'``). Default ``Event.BEFORE_LOAD``.

    Raises:
        ValueError: ``event`` is not an event.
        cadence.checkpoint.errors.CheckpointError: at ``event``, the checkpoint is missing,
            corrupt or does not fit the model.
    """

    def __init__(self, load_path: str, load_weights_only: bool = False,
                 strict_model_weights: bool = True, ignore_keys: Optional[list[str]] = None,
                 event: Union[str, Event] = Event.BEFORE_LOAD) -> None:
        super().__init__()
        self.load_path = str(load_path)
        self.load_weights_only = bool(load_weights_only)
        self.strict_model_weights = bool(strict_model_weights)
        self.ignore_keys = list(ignore_keys) if ignore_keys is not None else None
        self.event = _event(event)

    def run_event(self, event: Event, state: State, logger: Any) -> None:
        if event == self.event:
            log.info("Loading checkpoint %s at %s.", self.load_path, self.event.value)
            self._load(state, logger)
            log.info("Loaded checkpoint %s at %s.", self.load_path, self.event.value)
        super().run_event(event, state, logger)

    def _load(self, state: State, logger: Any) -> None:
        from cadence.utils.checkpoint import load_checkpoint

        model = state.model
        peft_only = getattr(model, "should_save_peft_only", None)
        if peft_only:
            model.should_save_peft_only = False
        try:
            load_checkpoint(self.load_path, state, logger,
                            load_weights_only=self.load_weights_only,
                            strict_model_weights=self.strict_model_weights,
                            ignore_keys=self.ignore_keys)
        finally:
            if peft_only:
                model.should_save_peft_only = peft_only
