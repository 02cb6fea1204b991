"""``Trainer.predict``: run the model over a dataloader and collect its outputs, firing the
``PREDICT_*`` events.

Source: MosaicML Composer's ``Trainer.predict`` (``composer/trainer/trainer.py``): same
arguments, events and return value.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

import torch

from cadence.core import Engine, Event, State, Timestamp
from cadence.core.data_spec import DataSpec, batch_to_device, count_tokens
from cadence.core.precision import Precision, get_precision_context
from cadence.trainer.pipeline_eval import PipelineForward, broadcast_outputs
from cadence.utils.misc import unwrap_model

__all__ = ["predict_loop", "to_cpu"]


def to_cpu(outputs: Any) -> Any:
    """``outputs`` with every tensor detached and moved to the CPU (mappings, lists and
    tuples rebuilt), so collected predictions do not hold device memory."""
    if isinstance(outputs, torch.Tensor):
        return outputs.detach().cpu()
    moved = batch_to_device(outputs, torch.device("cpu"))  # non-blocking copies ...
    if torch.cuda.is_available():
        torch.cuda.synchronize()  # ... finished before anyone reads them
    return moved


def predict_loop(state: State, engine: Engine, dataloader: Iterable[Any],
                 subset_num_batches: int = -1, return_outputs: bool = True,
                 data_spec: Optional[DataSpec] = None,
                 pipeline: Optional[PipelineForward] = None) -> list[Any]:
    """Forward every batch of ``dataloader`` (at most ``subset_num_batches``; ``-1``: all)
    through ``state.model`` in eval mode without gradients, in the run's precision.

    Events: ``PREDICT_START``; per batch ``PREDICT_BATCH_START``,
    ``PREDICT_BEFORE_FORWARD``, ``PREDICT_AFTER_FORWARD`` (``state.outputs`` holds the
    outputs; a callback may write them somewhere), ``PREDICT_BATCH_END``; ``PREDICT_END``.
    ``state.predict_timestamp`` starts at zero and counts each batch (this rank's samples
    and tokens) before ``PREDICT_BATCH_END``, as Composer's. The model's training mode is
    restored afterwards. With a ``data_spec``, its
    ``batch_transforms`` run before each batch moves to the device, its ``device_transforms``
    and ``microbatch_transforms`` after.

    Under a pipeline (``pipeline``: :class:`~cadence.trainer.pipeline_eval.PipelineForward`)
    each batch goes through the stages forward-only and the last stage's outputs are
    broadcast (on the CPU) over the pipeline group: every rank's ``state.outputs`` at
    ``PREDICT_AFTER_FORWARD`` and its returned list hold its samples' outputs, as without a
    pipeline (Composer's ``predict`` returns each rank's own).

    Returns:
        The outputs of each batch, on the CPU, in order, when ``return_outputs``; else ``[]``
        (outputs are dropped after ``PREDICT_BATCH_END``, to predict over data that does not
        fit in memory).

    Raises:
        ValueError: ``subset_num_batches`` below ``-1``.
    """
    if subset_num_batches < -1:
        raise ValueError(f"subset_num_batches must be -1 (all) or >= 0, got {subset_num_batches}.")
    model = state.model
    was_training = model.training
    outputs: list[Any] = []
    spec = DataSpec(dataloader) if data_spec is None else data_spec  # the batch counters
    counter = getattr(unwrap_model(model), "num_tokens", None)
    state.predict_timestamp = Timestamp()
    engine.run_event(Event.PREDICT_START)
    model.eval()
    try:
        with torch.no_grad():
            for index, batch in enumerate(dataloader):
                if 0 <= subset_num_batches <= index:
                    break
                if data_spec is None:
                    state.batch = batch_to_device(batch, state.device)
                else:
                    state.batch = data_spec.microbatch_transforms(
                        data_spec.batch_on_device(batch, state.device))
                samples = int(spec.get_num_samples_in_batch(state.batch))
                tokens = count_tokens(spec, batch, state.batch, counter)
                engine.run_event(Event.PREDICT_BATCH_START)
                engine.run_event(Event.PREDICT_BEFORE_FORWARD)
                with get_precision_context(Precision(state.precision), device=state.device):
                    if pipeline is None:
                        state.outputs = model(state.batch)
                    else:  # the last stage's, on every rank of the pipeline
                        raw = pipeline(state.batch)
                        state.outputs = broadcast_outputs(
                            None if raw is None else to_cpu(raw), pipeline)
                engine.run_event(Event.PREDICT_AFTER_FORWARD)
                if return_outputs:
                    outputs.append(to_cpu(state.outputs))
                state.predict_timestamp = state.predict_timestamp.to_next_batch(samples, tokens)
                engine.run_event(Event.PREDICT_BATCH_END)
                state.outputs = None
    finally:
        model.train(was_training)
        if pipeline is not None:
            pipeline.wait()
    engine.run_event(Event.PREDICT_END)
    return outputs
