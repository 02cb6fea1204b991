"""The :class:`Callback` base class: one no-op method per :class:`~cadence.Event`.

Override only the events you need. Callbacks observe and log; they do not change the run
(that is what an :class:`~cadence.Algorithm` is for). Source: MosaicML Composer's
``Callback`` (``composer/core/callback.py``); method names are the events' values.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cadence.core.event import Event
from cadence.core.serializable import Serializable

if TYPE_CHECKING:
    from cadence.core.state import State

__all__ = ["Callback"]


class Callback(Serializable):
    """Base class for callbacks. ``run_event`` dispatches to the method named after the event.

    Callbacks that hold state (a counter, a best metric) override :meth:`state_dict` and
    :meth:`load_state_dict`, so checkpoints carry it.

    ``Callback.__init__`` takes and ignores any arguments, as Composer's does, so a subclass
    may call ``super().__init__(*args, **kwargs)`` with its own.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        del args, kwargs

    def run_event(self, event: Event, state: State, logger: Any) -> None:
        """Call the method named ``event.value`` (e.g. ``batch_end``)."""
        getattr(self, event.value)(state, logger)

    def init(self, state: State, logger: Any) -> None:
        """Called on ``Event.INIT``."""
        del state, logger

    def before_load(self, state: State, logger: Any) -> None:
        """Called on ``Event.BEFORE_LOAD``."""
        del state, logger

    def after_load(self, state: State, logger: Any) -> None:
        """Called on ``Event.AFTER_LOAD``."""
        del state, logger

    def fit_start(self, state: State, logger: Any) -> None:
        """Called on ``Event.FIT_START``."""
        del state, logger

    def epoch_start(self, state: State, logger: Any) -> None:
        """Called on ``Event.EPOCH_START``."""
        del state, logger

    def before_dataloader(self, state: State, logger: Any) -> None:
        """Called on ``Event.BEFORE_DATALOADER``."""
        del state, logger

    def after_dataloader(self, state: State, logger: Any) -> None:
        """Called on ``Event.AFTER_DATALOADER``."""
        del state, logger

    def batch_start(self, state: State, logger: Any) -> None:
        """Called on ``Event.BATCH_START``."""
        del state, logger

    def before_train_batch(self, state: State, logger: Any) -> None:
        """Called on ``Event.BEFORE_TRAIN_BATCH``."""
        del state, logger

    def before_forward(self, state: State, logger: Any) -> None:
        """Called on ``Event.BEFORE_FORWARD``."""
        del state, logger

    def after_forward(self, state: State, logger: Any) -> None:
        """Called on ``Event.AFTER_FORWARD``."""
        del state, logger

    def before_loss(self, state: State, logger: Any) -> None:
        """Called on ``Event.BEFORE_LOSS``."""
        del state, logger

    def after_loss(self, state: State, logger: Any) -> None:
        """Called on ``Event.AFTER_LOSS``."""
        del state, logger

    def before_backward(self, state: State, logger: Any) -> None:
        """Called on ``Event.BEFORE_BACKWARD``."""
        del state, logger

    def after_backward(self, state: State, logger: Any) -> None:
        """Called on ``Event.AFTER_BACKWARD``."""
        del state, logger

    def after_train_batch(self, state: State, logger: Any) -> None:
        """Called on ``Event.AFTER_TRAIN_BATCH``."""
        del state, logger

    def batch_end(self, state: State, logger: Any) -> None:
        """Called on ``Event.BATCH_END``."""
        del state, logger

    def batch_checkpoint(self, state: State, logger: Any) -> None:
        """Called on ``Event.BATCH_CHECKPOINT``."""
        del state, logger

    def epoch_end(self, state: State, logger: Any) -> None:
        """Called on ``Event.EPOCH_END``."""
        del state, logger

    def epoch_checkpoint(self, state: State, logger: Any) -> None:
        """Called on ``Event.EPOCH_CHECKPOINT``."""
        del state, logger

    def fit_end(self, state: State, logger: Any) -> None:
        """Called on ``Event.FIT_END``."""
        del state, logger

    def eval_before_all(self, state: State, logger: Any) -> None:
        """Called on ``Event.EVAL_BEFORE_ALL``."""
        del state, logger

    def eval_start(self, state: State, logger: Any) -> None:
        """Called on ``Event.EVAL_START``."""
        del state, logger

    def eval_batch_start(self, state: State, logger: Any) -> None:
        """Called on ``Event.EVAL_BATCH_START``."""
        del state, logger

    def eval_before_forward(self, state: State, logger: Any) -> None:
        """Called on ``Event.EVAL_BEFORE_FORWARD``."""
        del state, logger

    def eval_after_forward(self, state: State, logger: Any) -> None:
        """Called on ``Event.EVAL_AFTER_FORWARD``."""
        del state, logger

    def eval_batch_end(self, state: State, logger: Any) -> None:
        """Called on ``Event.EVAL_BATCH_END``."""
        del state, logger

    def eval_end(self, state: State, logger: Any) -> None:
        """Called on ``Event.EVAL_END``."""
        del state, logger

    def eval_after_all(self, state: State, logger: Any) -> None:
        """Called on ``Event.EVAL_AFTER_ALL``."""
        del state, logger

    def eval_standalone_start(self, state: State, logger: Any) -> None:
        """Called on ``Event.EVAL_STANDALONE_START`` (``Trainer.eval()``)."""
        del state, logger

    def eval_standalone_end(self, state: State, logger: Any) -> None:
        """Called on ``Event.EVAL_STANDALONE_END``."""
        del state, logger

    def predict_start(self, state: State, logger: Any) -> None:
        """Called on ``Event.PREDICT_START`` (``Trainer.predict()``)."""
        del state, logger

    def predict_batch_start(self, state: State, logger: Any) -> None:
        """Called on ``Event.PREDICT_BATCH_START``."""
        del state, logger

    def predict_before_forward(self, state: State, logger: Any) -> None:
        """Called on ``Event.PREDICT_BEFORE_FORWARD``."""
        del state, logger

    def predict_after_forward(self, state: State, logger: Any) -> None:
        """Called on ``Event.PREDICT_AFTER_FORWARD``."""
        del state, logger

    def predict_batch_end(self, state: State, logger: Any) -> None:
        """Called on ``Event.PREDICT_BATCH_END``."""
        del state, logger

    def predict_end(self, state: State, logger: Any) -> None:
        """Called on ``Event.PREDICT_END``."""
        del state, logger

    def close(self) -> None:
        """Flush and release resources at the end of a run. Must be safe to call twice."""
