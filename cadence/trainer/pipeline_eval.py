"""Forward-only passes under a pipeline (``parallelism_config.pp``): evaluation, ``predict``
and the metric values every rank logs.

:class:`PipelineForward` runs one (micro)batch through the pipeline's stages without
gradients: the rank holding stage 0 feeds the batch's inputs, each stage's rank runs its
stage modules (the parallelized ones the training schedule runs) and sends the activation to
the next stage's rank; the last stage's rank gets the model's outputs (the split's
``outputs(last_stage_output, batch)``, what ``model(batch)`` returns without a pipeline). It
is not the training schedule: a ``torch.distributed.pipelining`` schedule is built for one
activation shape and one number of microbatches, and an eval set's last batch is often
smaller (or its sequences of another length); here each call sends the activation's shape
ahead of it, so any batch runs. Sends are asynchronous (a stage's rank moves on to the next
microbatch while the next rank computes), so microbatches still overlap across stages.

Metrics are updated on the last stage's ranks only (they see the outputs); their states are
then copied to the other ranks of the pipeline (:func:`share_metric_states`), so
``metric.compute()`` (synced over the data-parallel ranks as usual) gives every rank, rank
0's loggers and the callbacks that read metrics included, the same values.

Source: the forward-only schedule of ``torch.distributed.pipelining``
(``_ScheduleForwardOnly``: receive, forward, send per microbatch).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch
import torch.distributed as torch_dist

from cadence.parallel.pipeline import Pipeline, stage_ids

__all__ = ["PipelineForward", "share_metric_states", "broadcast_outputs"]

_KEY = "parallelism_config.pp"
_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64,
           torch.int32, torch.bool)
_HEADER = 10  # ndim, dtype index, up to 8 sizes


class PipelineForward:
    """One forward-only pass of a batch through the whole pipeline (every rank calls it with
    its batch; see the module docstring).

    Args:
        pipeline: this rank's :class:`~cadence.parallel.pipeline.Pipeline`.

    Calling it with a batch returns the model's outputs on the ranks that hold the last
    stage, ``None`` on the others. Shapes: the first stage takes ``split.inputs(batch)``
    (``input_ids [batch, seq]`` for the built-in splits); stages pass one tensor each
    (hidden states ``[batch, seq, d_model]``), of any dtype in :data:`_DTYPES` and at most 8
    dimensions.
    """

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        config = pipeline.config
        pp = config.pipeline_parallel_degree
        spr = int(config.stages_per_rank or 1)
        group = pipeline.group
        self._owner: dict[int, int] = {}  # stage -> global rank holding it
        for pp_rank in range(pp):
            for stage in stage_ids(pp_rank, pp, spr, config.schedule):
                self._owner[stage] = torch_dist.get_global_rank(group, pp_rank)
        self._rank = torch_dist.get_rank()
        self._last = config.num_stages - 1
        self._local = sorted(((stage.stage_index, module) for stage, module
                              in zip(pipeline.stages, pipeline.modules)), key=lambda p: p[0])
        self._pending: list[Any] = []  # (work, tensor) of the sends in flight

    @property
    def last_stage_rank(self) -> int:
        """The global rank of this pipeline's last stage (the one that sees the outputs)."""
        return self._owner[self._last]

    @property
    def has_last_stage(self) -> bool:
        """Whether this rank holds the last stage."""
        return self.pipeline.has_last_stage

    def __call__(self, batch: Any) -> Optional[Any]:
        """The model's outputs for ``batch`` on the last stage's ranks, else ``None``.

        Raises:
            ValueError: a stage returned something other than one tensor, or a DTensor
                activation (sequence-parallel stage outputs), naming the stage.
        """
        self.wait()  # the previous call's sends: their buffers may be reused now
        x: Optional[torch.Tensor] = None
        carried: Optional[torch.Tensor] = None
        for index, module in self._local:
            if index == 0:
                x = self.pipeline.split.inputs(batch)
            elif self._owner[index - 1] == self._rank:
                x = carried
            else:
                x = self._recv(self._owner[index - 1])
            x = module(x)
            if index == self._last:
                return self.pipeline.split.outputs(x, batch)
            if self._owner[index + 1] == self._rank:
                carried = x
            else:
                self._send(x, self._owner[index + 1])
        return None

    def wait(self) -> None:
        """Wait for the sends in flight (call after the last pass of a loop)."""
        for work, _ in self._pending:
            work.wait()
        self._pending = []

    def _send(self, tensor: Any, dst: int) -> None:
        from torch.distributed.tensor import DTensor

        if not isinstance(tensor, torch.Tensor) or isinstance(tensor, DTensor):
            raise ValueError(f"{_KEY}: a stage returned {type(tensor).__name__}; a "
                             f"forward-only pass (eval, predict) sends one plain tensor "
                             f"between stages.")
        if tensor.dtype not in _DTYPES or tensor.dim() > _HEADER - 2:
            raise ValueError(f"{_KEY}: an activation of dtype {tensor.dtype} and shape "
                             f"{tuple(tensor.shape)} cannot be sent between stages in a "
                             f"forward-only pass (dtypes {_DTYPES}, at most 8 dimensions).")
        header = torch.zeros(_HEADER, dtype=torch.int64)
        header[0], header[1] = tensor.dim(), _DTYPES.index(tensor.dtype)
        header[2:2 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
        header = header.to(tensor.device)
        payload = tensor.detach().contiguous()
        group = self.pipeline.group
        for item in (header, payload):
            self._pending.append((torch_dist.isend(item, dst=dst, group=group), item))

    def _recv(self, src: int) -> torch.Tensor:
        device = self.pipeline.device
        header = torch.zeros(_HEADER, dtype=torch.int64, device=device)
        torch_dist.recv(header, src=src, group=self.pipeline.group)
        values = header.tolist()
        shape = values[2:2 + values[0]]
        tensor = torch.empty(shape, dtype=_DTYPES[values[1]], device=device)
        torch_dist.recv(tensor, src=src, group=self.pipeline.group)
        return tensor


def share_metric_states(metrics: Mapping[str, Any], forward: PipelineForward) -> None:
    """Copy the last stage's metric states (``metric.metric_state``, its update count) to
    the other ranks of the pipeline, in place: then ``metric.compute()`` gives the same
    value on every rank (synced over the data-parallel ranks as usual), for the loggers and
    for callbacks that read the metrics (``EarlyStopper``). Call on every rank with the same
    metric names, after the updates.
    """
    if not metrics:
        return
    box: list[Any] = [None]
    if forward.has_last_stage:
        box[0] = {name: ({key: _to(value, torch.device("cpu"))
                          for key, value in metric.metric_state.items()},
                         int(metric.update_count)) for name, metric in metrics.items()}
    torch_dist.broadcast_object_list(box, src=forward.last_stage_rank,
                                     group=forward.pipeline.group)
    if forward.has_last_stage:
        return
    for name, (states, count) in box[0].items():
        metric = metrics[name]
        device = metric.device
        for key, value in states.items():
            setattr(metric, key, _to(value, device))
        metric._update_count = count  # torchmetrics' own counter (compute() reads it)
        metric._computed = None  # no cached value from before


def _to(value: Any, device: torch.device) -> Any:
    """A metric state (a tensor, or a list of them) on ``device``."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(device)
    if isinstance(value, list):
        return [_to(v, device) for v in value]
    return value


def broadcast_outputs(outputs: Any, forward: PipelineForward) -> Any:
    """The last stage's ``outputs`` (on the CPU: they are pickled) on every rank of the
    pipeline; ``outputs`` is ignored on the other ranks. Call on every rank."""
    box = [outputs if forward.has_last_stage else None]
    torch_dist.broadcast_object_list(box, src=forward.last_stage_rank,
                                     group=forward.pipeline.group)
    return box[0]
