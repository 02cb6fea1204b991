"""One training step under a pipeline schedule (``parallelism_config.pp``).

The schedule replaces the Trainer's microbatch loop: the rank's batch is cut into the
pipeline's microbatches, the first stage's rank feeds their inputs, and on the last stage
the model's own ``loss(outputs, microbatch)`` is the schedule's loss function, weighted by
the microbatch's share of the batch exactly as without a pipeline
(:class:`~cadence.trainer.loss_weighting.LossWeighting`: by samples, or by loss tokens
with ``accumulate_train_batch_on_tokens``), so the step is the single-process step. The
batch's loss (the sum of the weighted microbatch losses, known on the last stage) is
summed over the pipeline's ranks, so every rank holds it as ``state.loss`` /
``state.total_loss`` and rank 0 logs it.

Events: ``BEFORE_FORWARD`` fires before the schedule runs; ``AFTER_FORWARD``,
``BEFORE_LOSS``, ``AFTER_LOSS``, ``BEFORE_BACKWARD`` and ``AFTER_BACKWARD`` after it, once
per batch (the schedule interleaves the microbatches' forwards and backwards); there
``state.outputs`` is None and ``state.loss`` the batch's loss, already backpropagated.

Refused at ``INIT`` (:func:`check_pipeline_run`), each with its reason: the algorithms
but :data:`PIPELINE_ALGORITHMS` (:data:`ALGORITHM_REASONS`), train metrics, evaluators, ``'auto'`` microbatching,
optimizers with a closure, ``amp_fp16``; and :func:`refuse` for ``eval()``, ``predict()``,
``fit(eval_dataloader=...)`` and ``export_for_inference()``.

Source: torchtitan's ``forward_backward_step`` under PP (``torchtitan/train.py``).
"""

from __future__ import annotations

from typing import Any, ContextManager, Optional

import torch

from cadence.core import Engine, Event, State
from cadence.core.data_spec import DataSpec, num_samples
from cadence.parallel.pipeline import Pipeline, build_schedule
from cadence.trainer.loss_weighting import LossWeighting

__all__ = ["PipelineStep", "check_pipeline_run", "refuse", "ALGORITHM_REASONS",
           "PIPELINE_ALGORITHMS"]

_KEY = "parallelism_config.pp"

_GENERIC = ("it acts on the whole model or on each microbatch's forward, loss or backward, "
            "which a pipeline splits over ranks and schedules; remove it or train without pp")
ALGORITHM_REASONS = {
    "EMA": "it averages the whole model's weights, which no single rank holds",
    "SWA": "it averages the whole model's weights, which no single rank holds",
    "SAM": "it re-runs forward and backward through an optimizer closure, outside the schedule",
    "LabelSmoothing": "it rewrites the labels between microbatches' forward and loss, which "
                      "the schedule runs in one call",
    "SelectiveBackprop": "it prunes samples by a forward on the whole model",
    "SeqLengthWarmup": "it changes the sequence length per batch; pipeline stages are built "
                       "for one activation shape",
}
"""Why an algorithm cannot run under a pipeline (by class name); others: a generic reason."""
PIPELINE_ALGORITHMS = frozenset({"GradientClipping"})
"""Algorithms that run under a pipeline (gradient clipping: by the whole model's norm)."""


def refuse(what: str) -> None:
    """Raise the error for ``what`` (``"eval()"``, ``"predict()"``) under a pipeline.

    Raises:
        ValueError: always, naming ``what`` and what to do instead.
    """
    raise ValueError(f"{what} is not supported under pipeline parallelism ({_KEY}): the "
                     f"forward-only schedules are not wired to metrics yet. Save a checkpoint "
                     f"and evaluate it on one process or with fsdp.")


def check_pipeline_run(state: State, auto_microbatching: bool) -> None:
    """Refuse, at ``INIT``, what cannot run under a pipeline (see the module docstring).

    Raises:
        ValueError: each problem named, with its reason.
    """
    problems = []
    for algorithm in state.algorithms:
        name = type(algorithm).__name__
        if name in PIPELINE_ALGORITHMS:
            continue
        problems.append(f"algorithm {name}: not supported under pipeline parallelism: "
                        f"{ALGORITHM_REASONS.get(name, _GENERIC)}.")
    if state.train_metrics:
        problems.append(f"train metrics {sorted(state.train_metrics)}: not computed under "
                        f"pipeline parallelism (only the last stage sees the outputs); build "
                        f"the model without train metrics.")
    if state.evaluators:
        problems.append("eval_dataloader: evaluation is not supported under pipeline "
                        "parallelism yet; evaluate a checkpoint on one process or with fsdp.")
    if auto_microbatching:
        problems.append("device_train_microbatch_size='auto': the pipeline's microbatches are "
                        f"fixed; set {_KEY}.microbatch_size or num_microbatches.")
    if any(getattr(o, "uses_closure", False) or "closure" in type(o).__name__.lower()
           for o in state.optimizers):
        problems.append("an optimizer with a closure re-runs forward and backward outside the "
                        "pipeline schedule.")
    if state.precision == "amp_fp16":
        problems.append("precision amp_fp16: the gradient scaler is not wired through the "
                        "schedule; use amp_bf16 or fp32.")
    if problems:
        raise ValueError(f"{len(problems)} problem(s) with {_KEY}:\n"
                         + "\n".join(f"  - {p}" for p in problems))


class PipelineStep:
    """Runs one batch's forward and backward through the pipeline schedule.

    Args:
        pipeline: this rank's :class:`~cadence.parallel.pipeline.Pipeline`.
        state / engine: the run's.
        weighting: the run's loss weighting (its ``begin_batch`` ran for the batch).

    The state's ``device_train_microbatch_size`` (an int or None) is the pipeline's
    microbatch size when ``pp`` sets neither microbatch key.
    """

    def __init__(self, pipeline: Pipeline, state: State, engine: Engine,
                 weighting: LossWeighting) -> None:
        self.pipeline, self.state, self.engine = pipeline, state, engine
        self._weighting = weighting
        self._microbatches: list[Any] = []
        self._shape: Optional[tuple[int, ...]] = None
        self._num_microbatches: Optional[int] = None

    def _count(self, batch_size: int) -> int:
        """Microbatches for a rank's batch of ``batch_size`` samples.

        Raises:
            ValueError: the batch does not divide into the microbatches.
        """
        config = self.pipeline.config
        if config.num_microbatches is not None:
            count, how = config.num_microbatches, f"{_KEY}.num_microbatches"
        else:
            size = config.microbatch_size or self.state.device_train_microbatch_size
            if size is not None:
                how = (f"{_KEY}.microbatch_size" if config.microbatch_size
                       else "device_train_microbatch_size")
                count = batch_size // size if batch_size % size == 0 else 0
            else:
                count, how = config.num_stages, "one microbatch per stage (the default)"
        if count < 1 or batch_size % count != 0:
            raise ValueError(f"{_KEY}: the rank's batch of {batch_size} samples does not split "
                             f"evenly into microbatches ({how}); use a batch size that does "
                             f"(and drop_last=True).")
        return count

    def _loss(self, output: Any, index: torch.Tensor) -> torch.Tensor:
        """The schedule's loss function: microbatch ``index``'s weighted loss."""
        microbatch = self._microbatches[int(index.reshape(-1)[0])]
        outputs = self.pipeline.split.outputs(output, microbatch)
        module = self.pipeline.model
        return self._weighting.weigh(module.loss(outputs, microbatch), microbatch)

    def forward_backward(self, batch: Any, spec: DataSpec,
                         precision_context: ContextManager[None]) -> torch.Tensor:
        """Zero the gradients, run ``batch`` through the schedule (gradients accumulate in
        this rank's stages) and return the batch's loss (every rank: the same value).

        Raises:
            ValueError: a batch that does not split into the pipeline's microbatches, or
                whose shape differs from the first batch's (stages are built for one shape).
        """
        state, engine, pipeline = self.state, self.engine, self.pipeline
        batch_size = num_samples(batch)
        count = self._count(batch_size)
        inputs = pipeline.split.inputs(batch)
        shape = tuple(inputs.shape)
        if self._shape is None:
            self._shape, self._num_microbatches = shape, count
            pipeline.schedule = build_schedule(pipeline, count, self._loss)
        elif shape != self._shape or count != self._num_microbatches:
            raise ValueError(f"{_KEY}: this batch's inputs are {shape}, the first batch's "
                             f"{self._shape}; pipeline stages run one shape. Use drop_last=True "
                             f"and a fixed sequence length.")
        self._microbatches = [self._weighting.prepare(mb)
                              for mb in spec.split_batch(batch, batch_size // count)]
        for optimizer in state.optimizers:
            optimizer.zero_grad(set_to_none=True)
        engine.run_event(Event.BEFORE_FORWARD)
        losses: list[torch.Tensor] = []
        args = (inputs,) if pipeline.has_first_stage else ()
        target = torch.arange(count) if pipeline.has_last_stage else None
        with precision_context:
            pipeline.schedule.step(*args, target=target, losses=losses)
        self._microbatches = []
        loss = (torch.stack([l.detach().float() for l in losses]).sum() if losses
                else torch.zeros((), device=pipeline.device))
        loss = loss.to(pipeline.device)
        torch.distributed.all_reduce(loss, group=pipeline.group)  # the last stage's, everywhere
        state.outputs, state.loss = None, loss
        for event in (Event.AFTER_FORWARD, Event.BEFORE_LOSS, Event.AFTER_LOSS,
                      Event.BEFORE_BACKWARD, Event.AFTER_BACKWARD):
            engine.run_event(event)
        return loss

