"""The events a :class:`~cadence.Trainer` fires, in order.

Names and values follow MosaicML Composer (``composer/core/event.py``), so a Composer
callback ports by renaming its imports.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["Event"]


class Event(str, Enum):
    """Points in the training loop where algorithms run and callbacks observe.

    The loop, as it fires (``#`` marks what happens between events)::

        INIT                     # algorithms do model surgery (activation checkpointing, ...)
        # parallelize: DDP / FSDP
        BEFORE_LOAD
        # load a checkpoint, if any
        AFTER_LOAD
        FIT_START
        for epoch in epochs:
            EPOCH_START
            for batch in dataloader:
                BEFORE_DATALOADER
                # batch = next(dataloader)
                AFTER_DATALOADER
                BATCH_START
                BEFORE_TRAIN_BATCH
                for microbatch in batch.split(device_train_microbatch_size):
                    BEFORE_FORWARD
                    # outputs = model(microbatch)
                    AFTER_FORWARD
                    BEFORE_LOSS
                    # loss = model.loss(outputs, microbatch) * microbatch_share
                    AFTER_LOSS
                    # state.outputs is released here, as a plain loop would (memory)
                    BEFORE_BACKWARD
                    # loss.backward()
                    AFTER_BACKWARD
                AFTER_TRAIN_BATCH      # gradients are final: clipping, child-tuning masks
                # optimizer.step(); scheduler.step(); timestamp advances one batch
                BATCH_END
                # eval, if eval_interval says so
                BATCH_CHECKPOINT
            EPOCH_END
            # eval, if eval_interval says so
            EPOCH_CHECKPOINT
        FIT_END

        # eval (inside fit, or Trainer.eval()):
        EVAL_BEFORE_ALL
        for each evaluator:
            EVAL_START
            for batch in eval_dataloader:
                EVAL_BATCH_START
                EVAL_BEFORE_FORWARD
                # outputs = model.eval_forward(batch); update metrics
                EVAL_AFTER_FORWARD
                EVAL_BATCH_END
            EVAL_END
        EVAL_AFTER_ALL

        # Trainer.eval() (standalone) wraps the eval events above:
        EVAL_STANDALONE_START
        # EVAL_BEFORE_ALL ... EVAL_AFTER_ALL
        EVAL_STANDALONE_END

        # Trainer.predict():
        PREDICT_START
        for batch in dataloader:
            PREDICT_BATCH_START
            PREDICT_BEFORE_FORWARD
            # outputs = model(batch)
            PREDICT_AFTER_FORWARD
            PREDICT_BATCH_END
        PREDICT_END

    Under pipeline parallelism (``parallelism_config.pp``) the schedule interleaves the
    microbatches' forwards and backwards in one call, so ``BEFORE_FORWARD`` fires once per
    batch before it, and ``AFTER_FORWARD`` ... ``AFTER_BACKWARD`` once per batch after it, on
    every rank: ``state.outputs`` is then None and ``state.loss`` the batch's loss, already
    backpropagated (:mod:`cadence.trainer.pipeline_step`). Label smoothing's
    ``BEFORE_LOSS`` / ``AFTER_LOSS`` work runs inside the schedule's loss function, per
    microbatch on the last stage, not at those batch events. Evaluation and ``predict`` keep
    their per-microbatch / per-batch events on every rank; at ``EVAL_AFTER_FORWARD``
    ``state.outputs`` is set on the last stage's ranks only (None elsewhere), at
    ``PREDICT_AFTER_FORWARD`` on every rank (broadcast from the last stage), and the metric
    states reach every rank before ``EVAL_END`` (:mod:`cadence.trainer.pipeline_eval`).

    A :class:`~cadence.Callback` has one method per event, named after its value
    (``Event.BATCH_END`` -> ``Callback.batch_end``).
    """

    INIT = "init"
    BEFORE_LOAD = "before_load"
    AFTER_LOAD = "after_load"
    FIT_START = "fit_start"

    EPOCH_START = "epoch_start"
    BEFORE_DATALOADER = "before_dataloader"
    AFTER_DATALOADER = "after_dataloader"
    BATCH_START = "batch_start"
    BEFORE_TRAIN_BATCH = "before_train_batch"

    BEFORE_FORWARD = "before_forward"
    AFTER_FORWARD = "after_forward"
    BEFORE_LOSS = "before_loss"
    AFTER_LOSS = "after_loss"
    BEFORE_BACKWARD = "before_backward"
    AFTER_BACKWARD = "after_backward"

    AFTER_TRAIN_BATCH = "after_train_batch"
    BATCH_END = "batch_end"
    BATCH_CHECKPOINT = "batch_checkpoint"
    EPOCH_END = "epoch_end"
    EPOCH_CHECKPOINT = "epoch_checkpoint"
    FIT_END = "fit_end"

    EVAL_BEFORE_ALL = "eval_before_all"
    EVAL_START = "eval_start"
    EVAL_BATCH_START = "eval_batch_start"
    EVAL_BEFORE_FORWARD = "eval_before_forward"
    EVAL_AFTER_FORWARD = "eval_after_forward"
    EVAL_BATCH_END = "eval_batch_end"
    EVAL_END = "eval_end"
    EVAL_AFTER_ALL = "eval_after_all"

    EVAL_STANDALONE_START = "eval_standalone_start"
    EVAL_STANDALONE_END = "eval_standalone_end"

    PREDICT_START = "predict_start"
    PREDICT_BATCH_START = "predict_batch_start"
    PREDICT_BEFORE_FORWARD = "predict_before_forward"
    PREDICT_AFTER_FORWARD = "predict_after_forward"
    PREDICT_BATCH_END = "predict_batch_end"
    PREDICT_END = "predict_end"

    @property
    def is_before_event(self) -> bool:
        """True for ``BEFORE_*`` (and ``EVAL_BEFORE_*``, ``PREDICT_BEFORE_*``) events."""
        return self.value.startswith(("before_", "eval_before_", "predict_before_"))

    @property
    def is_after_event(self) -> bool:
        """True for ``AFTER_*`` (and ``EVAL_AFTER_*``, ``PREDICT_AFTER_*``) events: algorithms
        run in reverse here."""
        return self.value.startswith(("after_", "eval_after_", "predict_after_"))

    @property
    def is_eval(self) -> bool:
        """True for the ``EVAL_*`` events."""
        return self.value.startswith("eval_")

    @property
    def is_predict(self) -> bool:
        """True for the ``PREDICT_*`` events."""
        return self.value.startswith("predict_")
