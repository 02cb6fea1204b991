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
The loss algorithms (:data:`LOSS_ALGORITHMS`: label smoothing) run inside the loss
function instead, per microbatch on the last stage, and train metrics are updated there on
each microbatch's outputs; their states reach every rank when they are logged
(:func:`~cadence.trainer.pipeline_eval.share_metric_states`). Evaluation and ``predict``
run :class:`~cadence.trainer.pipeline_eval.PipelineForward`.

Refused before ``INIT`` (:func:`check_pipeline_run`), each with its reason: the algorithms
that are neither surgery (``INIT`` / ``BEFORE_LOAD`` / ``AFTER_LOAD`` only) nor in
:data:`PIPELINE_ALGORITHMS` (:data:`ALGORITHM_REASONS`, else a generic reason), the
callbacks of :data:`CALLBACK_REASONS` (``Generate``, ``ExportForInferenceCallback``),
``'auto'`` microbatching, optimizers with a closure, ``amp_fp16``; and :func:`refuse` for
``export_for_inference()``. A model's whole-model ``flops_per_batch`` is switched off
(``SpeedMonitor`` logs no FLOPs / MFU under a pipeline).

Source: torchtitan's ``forward_backward_step`` under PP (``torchtitan/train.py``).
"""

from __future__ import annotations

from typing import Any, ContextManager, Optional

import torch

from cadence.core import Engine, Event, State
from cadence.core.data_spec import DataSpec, num_samples
from cadence.parallel.pipeline import Pipeline, build_schedule
from cadence.trainer.loss_weighting import LossWeighting
from cadence.trainer.pipeline_eval import PipelineForward, share_metric_states

__all__ = ["PipelineStep", "check_pipeline_run", "refuse", "AUTO_MICROBATCH_REASON",
           "AMP_FP16_REASON", "ALGORITHM_REASONS",
           "PIPELINE_ALGORITHMS", "LOSS_ALGORITHMS", "CALLBACK_REASONS"]

_KEY = "parallelism_config.pp"

_SURGERY_EVENTS = frozenset({Event.INIT, Event.BEFORE_LOAD, Event.AFTER_LOAD})
_GENERIC = ("it acts on the whole model or on each microbatch's forward, loss or backward, "
            "which a pipeline splits over ranks and schedules; remove it or train without pp")
_IMAGES = ("it transforms image batches or image models' inputs per batch; cadence's pipeline "
           "runs fixed-shape stages of the language models it splits, and this is not wired "
           "through it; remove it or train without pp")
ALGORITHM_REASONS = {
    "SWA": "it keeps an AveragedModel copy of the whole model and swaps it in, which no "
           "single rank holds",
    "SAM": "it re-runs forward and backward through an optimizer closure, outside the schedule",
    "SelectiveBackprop": "it prunes samples by a forward on the whole model",
    "SeqLengthWarmup": "it changes the sequence length per batch; pipeline stages are built "
                       "for one activation shape",
    "Alibi": "train_sequence_length_scaling < 1 reshapes each batch; pipeline stages are built "
             "for one activation shape (set train_sequence_length_scaling=1.0)",
    "LayerFreezing": "it freezes the first layers of the whole model by the optimizer's "
                     "parameter order, and each pipeline rank's optimizer holds only its "
                     "stages' parameters",
    "ChildTuning": "its masks select a fraction of all the model's gradient entries (one "
                   "threshold over the whole model), and each rank holds only its stages'",
    "NoOpModel": "it replaces the model with one that has no blocks to split into stages",
    "StochasticDepth": "it drops residual blocks per batch by their depth in the whole model",
    "CutMix": "it mixes each microbatch's inputs before the forward and its targets between "
              "forward and loss, which the schedule runs in one call",
    "MixUp": "it mixes each microbatch's inputs before the forward and its targets between "
             "forward and loss, which the schedule runs in one call",
    "ColOut": _IMAGES, "CutOut": _IMAGES, "ProgressiveResizing": _IMAGES, "AugMix": _IMAGES,
    "RandAugment": _IMAGES,
}
"""Why an algorithm cannot run under a pipeline (by class name); others: a generic reason."""
PIPELINE_ALGORITHMS = frozenset({"GradientClipping", "EMA", "LabelSmoothing", "Alibi",
                                 "GyroDropout"})
"""Algorithms that run under a pipeline besides the surgery ones (whose events are only
``INIT``, ``BEFORE_LOAD`` and ``AFTER_LOAD``: they change the model before it is split):
gradient clipping by the whole model's norm; EMA, each rank averaging the parameters it holds
(together, the whole model's EMA; checkpointed per stage); label smoothing, applied in the
schedule's loss function on the last stage; Alibi with ``train_sequence_length_scaling=1``
(surgery only); GyroDropout (its dropout layers, per stage)."""
LOSS_ALGORITHMS = frozenset({"LabelSmoothing"})
"""Algorithms that act at ``BEFORE_LOSS`` / ``AFTER_LOSS`` only: under a pipeline they run
inside the schedule's loss function, per microbatch on the last stage (not at the batch's
``BEFORE_LOSS`` / ``AFTER_LOSS``, which fire after the schedule)."""
CALLBACK_REASONS = {
    "Generate": "it generates text autoregressively with the whole model on each rank, which "
                "no single rank holds; generate from a checkpoint on one process",
    "ExportForInferenceCallback": "export_for_inference needs the whole model on one rank; export a "
                          "checkpoint from one process",
}
"""Callbacks refused under a pipeline (by class name), with the reason."""


def _runs_under_pipeline(algorithm: Any) -> Optional[str]:
    """None when ``algorithm`` runs under a pipeline, else why not."""
    name = type(algorithm).__name__
    if name == "Alibi":
        if float(getattr(algorithm, "train_sequence_length_scaling", 1.0)) == 1.0:
            return None
        return ALGORITHM_REASONS[name]
    if name in PIPELINE_ALGORITHMS:
        return None
    if name in ALGORITHM_REASONS:
        return ALGORITHM_REASONS[name]
    events = getattr(algorithm, "events", None)
    if events is not None and set(events) <= _SURGERY_EVENTS:
        return None  # it changes the model at INIT, before the split
    return _GENERIC


AUTO_MICROBATCH_REASON = ("device_train_microbatch_size='auto': the pipeline's microbatches "
                          f"are fixed; set {_KEY}.microbatch_size or num_microbatches.")
"""Why ``'auto'`` microbatching is refused under a pipeline (the Trainer's and ``plan``'s)."""
AMP_FP16_REASON = ("precision amp_fp16: the gradient scaler is not wired through the schedule; "
                   "use amp_bf16 or fp32.")
"""Why ``amp_fp16`` is refused under a pipeline (the Trainer's and ``plan``'s)."""


def refuse(what: str) -> None:
    """Raise the error for ``what`` (``"Trainer.export_for_inference()"``) under a pipeline.

    Raises:
        ValueError: always, naming ``what`` and what to do instead.
    """
    raise ValueError(f"{what} is not supported under pipeline parallelism ({_KEY}): it needs "
                     f"the whole model on one rank, and each pipeline rank holds only its "
                     f"stages. Save a checkpoint and export it from one process.")


def check_pipeline_run(state: State, auto_microbatching: bool) -> None:
    """Refuse, at ``INIT``, what cannot run under a pipeline (see the module docstring).

    Raises:
        ValueError: each problem named, with its reason.
    """
    problems = []
    for algorithm in state.algorithms:
        reason = _runs_under_pipeline(algorithm)
        if reason is not None:
            problems.append(f"algorithm {type(algorithm).__name__}: not supported under "
                            f"pipeline parallelism: {reason}.")
    for callback in state.callbacks:
        name = type(callback).__name__
        if name in CALLBACK_REASONS:
            problems.append(f"callback {name}: not supported under pipeline parallelism: "
                            f"{CALLBACK_REASONS[name]}.")
    if auto_microbatching:
        problems.append(AUTO_MICROBATCH_REASON)
    if any(getattr(o, "uses_closure", False) or "closure" in type(o).__name__.lower()
           for o in state.optimizers):
        problems.append("an optimizer with a closure re-runs forward and backward outside the "
                        "pipeline schedule.")
    if state.precision == "amp_fp16":
        problems.append(AMP_FP16_REASON)
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
        if callable(getattr(pipeline.model, "flops_per_batch", None)):
            # a whole-model counter does not apply to a rank's stages (and may read modules
            # another rank holds): SpeedMonitor logs throughput, not FLOPs or MFU, under pp
            pipeline.model.flops_per_batch = None
        self._calls = 0  # loss-function calls in this step
        self._probes = 0  # of which the schedule's shape probe (its first step, last stage)
        self.forward_only = PipelineForward(pipeline)
        """The forward-only pass (evaluation, ``predict``)."""
        self._loss_algorithms = [a for a in state.algorithms
                                 if type(a).__name__ in LOSS_ALGORITHMS]
        if self._loss_algorithms:  # they run in the loss function, not after the schedule
            hidden = {id(a) for a in self._loss_algorithms}

            def in_loss_function(algorithms: list[Any], event: Event) -> list[Any]:
                if event in (Event.BEFORE_LOSS, Event.AFTER_LOSS):
                    return [a for a in algorithms if id(a) not in hidden]
                return algorithms

            engine.register_pass(in_loss_function)

    def share_metric_states(self, metrics: dict[str, Any]) -> None:
        """The last stage's states of ``metrics`` (the train metrics) on every rank of the
        pipeline (:func:`~cadence.trainer.pipeline_eval.share_metric_states`)."""
        share_metric_states(metrics, self.forward_only)

    def _count(self, batch_size: int) -> int:
        """Microbatches for a rank's batch of ``batch_size`` samples
        (:meth:`~cadence.parallel.pipeline_config.PPConfig.microbatches_for`).

        Raises:
            ValueError: the batch does not divide into microbatches the schedule can run.
        """
        return self.pipeline.config.microbatches_for(
            batch_size, self.state.device_train_microbatch_size)

    def _loss(self, output: Any, index: torch.Tensor) -> torch.Tensor:
        """The schedule's loss function: microbatch ``index``'s weighted loss (on the last
        stage), with the loss algorithms (label smoothing) around it and the train metrics
        updated on the microbatch's outputs, as the plain loop does."""
        state, module = self.state, self.pipeline.model
        microbatch = self._microbatches[int(index.reshape(-1)[0])]
        outputs = self.pipeline.split.outputs(output, microbatch)
        if not self._loss_algorithms:
            loss = self._weighting.weigh(module.loss(outputs, microbatch), microbatch)
        else:
            state.batch, state.outputs = microbatch, outputs
            for algorithm in self._loss_algorithms:
                algorithm.apply(Event.BEFORE_LOSS, state, self.engine.logger)
            loss = self._weighting.weigh(module.loss(state.outputs, state.batch), state.batch)
            state.loss = loss
            for algorithm in reversed(self._loss_algorithms):
                algorithm.apply(Event.AFTER_LOSS, state, self.engine.logger)
            microbatch, loss = state.batch, state.loss
            state.outputs = None
        self._calls += 1
        if state.train_metrics and self._calls > self._probes:  # not the shape probe
            with torch.no_grad():
                for metric in state.train_metrics.values():
                    module.update_metric(microbatch, outputs, metric)
        return loss

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
            # its first step infers the stages' shapes: one extra loss-function call on
            # uninitialised activations, before the microbatches' (kept out of the metrics)
            self._probes = 1 if pipeline.has_last_stage else 0
        elif shape != self._shape or count != self._num_microbatches:
            raise ValueError(f"{_KEY}: this batch's inputs are {shape}, the first batch's "
                             f"{self._shape}; pipeline stages run one shape. Use drop_last=True "
                             f"and a fixed sequence length.")
        self._microbatches = [self._weighting.prepare(mb)
                              for mb in spec.split_batch(batch, batch_size // count)]
        for optimizer in state.optimizers:
            optimizer.zero_grad(set_to_none=True)
        for metric in state.train_metrics.values():
            metric.reset()
        engine.run_event(Event.BEFORE_FORWARD)
        losses: list[torch.Tensor] = []
        args = (inputs,) if pipeline.has_first_stage else ()
        target = torch.arange(count) if pipeline.has_last_stage else None
        self._calls = 0
        with precision_context:
            pipeline.schedule.step(*args, target=target, losses=losses)
        if pipeline.has_last_stage and self._calls != count + self._probes:
            raise RuntimeError(f"{_KEY}: the schedule called the loss function {self._calls} "
                               f"times for {count} microbatches (expected "
                               f"{count + self._probes}); the train metrics would be wrong.")
        self._probes = 0
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

