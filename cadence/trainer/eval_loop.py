"""One evaluator's pass over its dataloader: forward in microbatches, metrics on the real
samples only, the ``EVAL_*`` events (Composer's evaluation loop, per evaluator)."""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from cadence.core import Engine, Event, State, Timestamp
from cadence.core.data_spec import DataSpec, count_tokens, slice_batch
from cadence.core.evaluator import Evaluator
from cadence.core.precision import Precision, get_precision_context
from cadence.loggers.logger import Logger
from cadence.parallel.data import real_samples_on_rank
from cadence.trainer.pipeline_eval import PipelineForward, share_metric_states

__all__ = ["EvalInterrupted", "evaluate"]


class EvalInterrupted(Exception):
    """An evaluation stopped at a batch boundary because ``stop_requested`` said so (a
    preemption signal); the model is back in train mode and ``state.dataloader`` the
    training one."""


def evaluate(state: State, engine: Engine, logger: Logger, module: Any, evaluator: Evaluator,
             limit: int, stop_requested: Optional[Callable[[], bool]] = None,
             pipeline: Optional[PipelineForward] = None) -> dict[str, float]:
    """Evaluate ``state.model`` on ``evaluator`` (at most ``limit`` batches; ``-1``: all) and
    log ``metrics/<label>/<name>``.

    Each batch goes through the evaluator's DataSpec (``batch_transforms``, the device,
    ``device_transforms``), is split into microbatches of ``device_eval_microbatch_size``
    samples (default: the whole batch; the DataSpec's ``split_batch``) and, per microbatch,
    ``microbatch_transforms``, ``EVAL_BEFORE_FORWARD``, the forward through the (possibly
    sharded) root model then ``module.eval_forward``, ``EVAL_AFTER_FORWARD`` and the metric
    updates. Every rank runs every forward (FSDP needs it); padded copies that a
    ``DistributedSampler`` added to even out the ranks do not reach the metrics. The model is
    in eval mode and back in train mode afterwards; ``state.dataloader`` is the evaluator's
    during the pass. ``stop_requested`` (the preemption check during ``fit``) is asked at
    each batch boundary.

    Under a pipeline (``pipeline``: :class:`~cadence.trainer.pipeline_eval.PipelineForward`)
    each microbatch goes through the pipeline's stages forward-only; ``eval_forward``, the
    metric updates and ``state.outputs`` at ``EVAL_AFTER_FORWARD`` are on the last stage's
    ranks only (``None`` elsewhere); the metric states are copied from there to the other
    ranks of the pipeline before ``EVAL_END``, so every rank computes the same values.

    Returns:
        ``{"metrics/<label>/<name>": value}``.

    Raises:
        EvalInterrupted: ``stop_requested()`` was true at a batch boundary.
    """
    metrics = state.eval_metrics.get(evaluator.label, {})
    for metric in metrics.values():
        metric.reset()
    train_loader = (state.dataloader, state.dataloader_label, state.dataloader_len)
    spec = evaluator.dataloader  # a DataSpec
    state.set_dataloader(spec.dataloader, evaluator.label)  # as Composer, during eval
    state.eval_timestamp = Timestamp()
    engine.run_event(Event.EVAL_START)
    state.model.eval()
    real_left = real_samples_on_rank(spec.dataloader)  # None: no padded copies
    try:
        _eval_batches(state, engine, module, evaluator, spec, metrics, limit, real_left,
                      stop_requested, pipeline)
    except EvalInterrupted:
        state.model.train()
        state.set_dataloader(*train_loader)
        raise
    if pipeline is not None:  # the last stage's states, on every rank of the pipeline
        pipeline.wait()
        share_metric_states(metrics, pipeline)
    results = {f"metrics/{evaluator.label}/{name}": float(metric.compute())
               for name, metric in metrics.items()}
    logger.log_metrics(results)
    state.eval_metric_values.update({name: results[f"metrics/{evaluator.label}/{name}"]
                                     for name in metrics})  # Composer's, by metric name
    engine.run_event(Event.EVAL_END)
    state.model.train()
    state.set_dataloader(*train_loader)
    return results


def _eval_batches(state: State, engine: Engine, module: Any, evaluator: Evaluator,
                  spec: DataSpec, metrics: dict[str, Any], limit: int,
                  real_left: Optional[int], stop_requested: Optional[Callable[[], bool]],
                  pipeline: Optional[PipelineForward] = None) -> None:
    """The evaluation's batches; ``stop_requested`` is asked before each one after the
    first (on every rank: it may be a collective).

    Raises:
        EvalInterrupted: ``stop_requested()`` was true.
    """
    counter = getattr(module, "num_tokens", None)
    with torch.no_grad():
        for index, batch in enumerate(spec.dataloader):
            if 0 <= limit <= index:
                break
            if index and stop_requested is not None and stop_requested():
                raise EvalInterrupted(f"evaluation of {evaluator.label!r} stopped at batch "
                                      f"{index}")
            device_batch = spec.batch_on_device(batch, state.device)
            state.batch = device_batch
            engine.run_event(Event.EVAL_BATCH_START)
            size = evaluator.device_eval_microbatch_size
            microbatches = [device_batch] if size is None else spec.split_batch(device_batch, size)
            for microbatch in microbatches:
                real_left = _eval_microbatch(state, engine, module, spec, metrics,
                                             spec.microbatch_transforms(microbatch), real_left,
                                             pipeline)
            state.batch = device_batch
            state.eval_timestamp = state.eval_timestamp.to_next_batch(
                int(spec.get_num_samples_in_batch(device_batch)),
                count_tokens(spec, batch, device_batch, counter))
            engine.run_event(Event.EVAL_BATCH_END)


def _eval_microbatch(state: State, engine: Engine, module: Any, spec: DataSpec,
                     metrics: dict[str, Any], microbatch: Any,
                     real_left: Optional[int],
                     pipeline: Optional[PipelineForward] = None) -> Optional[int]:
    """Forward one microbatch and update ``metrics`` on its real samples; returns how many
    real samples this rank has left (``None``: every sample is real). Under a pipeline,
    only the last stage's ranks get outputs and update the metrics."""
    state.batch = microbatch
    engine.run_event(Event.EVAL_BEFORE_FORWARD)
    with get_precision_context(Precision(state.precision), device=state.device):
        # forward through the (possibly sharded) root so FSDP's hooks run, then let the
        # model turn the outputs into what its metrics take
        outputs = state.model(state.batch) if pipeline is None else pipeline(state.batch)
        state.outputs = None if outputs is None else module.eval_forward(state.batch, outputs)
    engine.run_event(Event.EVAL_AFTER_FORWARD)
    batch, outputs = state.batch, state.outputs
    seen = pipeline is None or outputs is not None  # under a pipeline: the last stage
    keep: Optional[int] = None
    if real_left is not None:
        size = int(spec.get_num_samples_in_batch(batch))
        keep = max(0, min(size, real_left))
        real_left -= size
        if keep < size and seen:
            batch, outputs = slice_batch(batch, 0, keep), slice_batch(outputs, 0, keep)
    if seen and (keep is None or keep > 0):
        update: Callable[..., None] = module.update_metric
        for metric in metrics.values():
            update(batch, outputs, metric)
    return real_left
