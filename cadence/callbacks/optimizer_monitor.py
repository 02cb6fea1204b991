"""The :class:`OptimizerMonitor` callback: L2 norms of the gradients and of the parameters.

Source: MosaicML Composer's ``OptimizerMonitor`` (``composer/callbacks/optimizer_monitor.py``);
the norms come from :func:`~cadence.trainer.parallel.grad_norm.get_grad_norm` and
:func:`~cadence.trainer.parallel.grad_norm.get_param_norm`, which are correct under DDP and
FSDP2 (they reduce DTensor shards over the mesh).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Union

import torch

from cadence.trainer.core import Callback, Time, TimeUnit
from cadence.trainer.parallel.grad_norm import get_grad_norm, get_param_norm
from cadence.trainer.registry import callbacks

if TYPE_CHECKING:
    from cadence.trainer.core import State

__all__ = ["OptimizerMonitor"]


def _named_parameters(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Parameter]]:
    """The model's parameters under the user's names (without DDP's ``module.`` prefix)."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model = model.module
    return model.named_parameters()


@callbacks.register("optimizer_monitor")
class OptimizerMonitor(Callback):
    """Logs the global L2 norm of the gradients and of the parameters, on the first step
    and every ``log_interval`` steps.

    - ``l2_norm/grad/global``: the norm of all gradients together, read at
      ``AFTER_TRAIN_BATCH``, where the gradients are final for the step (accumulated over
      microbatches, all-reduced by DDP or reduce-scattered by FSDP) and the optimizer has
      not stepped yet. Algorithms run before callbacks on an event, so with
      :class:`~cadence.algorithms.GradientClipping` this is the norm *after* clipping (as in
      Composer). Under AMP fp16 the trainer's gradients at that point are still multiplied
      by the loss scale.
    - ``l2_norm/param/global``: the norm of all parameters, read at ``BATCH_END`` (after the
      optimizer step: the weights the next batch uses).
    - with ``log_per_layer``: ``l2_norm/grad/<param name>`` and ``l2_norm/param/<param name>``
      for every parameter (names as in the unwrapped model's ``named_parameters``).

    All ranks get the same values (the norms are reduced over the ranks under FSDP), and
    every rank must run this callback (under FSDP it runs collectives). Nothing is computed
    on other steps; on a logging step the norms stay on the device until a logger destination
    writes them, so the callback itself adds no host sync. With ``log_per_layer`` under FSDP
    every parameter costs a small all-reduce on logging steps.

    Args:
        log_interval: log every this many batches (an ``int`` or ``"10ba"``), plus the first;
            default 10, the Trainer's default ``log_interval``.
        log_per_layer: also log each parameter's gradient and weight norm (default off).

    Raises:
        ValueError: ``log_interval`` is not a positive number of batches.
    """

    def __init__(self, log_interval: Union[int, str, Time] = 10,
                 log_per_layer: bool = False) -> None:
        interval = Time.from_input(log_interval, TimeUnit.BATCH)
        if interval.unit != TimeUnit.BATCH or interval.value < 1:
            raise ValueError(
                f"OptimizerMonitor log_interval must be a positive number of batches (e.g. 10 "
                f"or '10ba'); got {log_interval!r}."
            )
        self.log_interval = int(interval.value)
        self.log_per_layer = bool(log_per_layer)
        self._grad_norms: dict[str, torch.Tensor] = {}  # computed at AFTER_TRAIN_BATCH

    def _due(self, step: int) -> bool:
        return step == 1 or step % self.log_interval == 0

    def after_train_batch(self, state: State, logger: Any) -> None:
        del logger
        self._grad_norms = {}
        if not self._due(state.timestamp.batch + 1):  # the step this batch will complete
            return
        norms = {"l2_norm/grad/global": get_grad_norm(state.model.parameters())}
        if self.log_per_layer:
            for name, param in _named_parameters(state.model):
                if param.grad is not None:
                    norms[f"l2_norm/grad/{name}"] = get_grad_norm([param])
        self._grad_norms = norms

    def batch_end(self, state: State, logger: Any) -> None:
        if not self._due(state.timestamp.batch):
            return
        metrics: dict[str, Any] = dict(self._grad_norms)
        self._grad_norms = {}
        metrics["l2_norm/param/global"] = get_param_norm(state.model.parameters())
        if self.log_per_layer:
            for name, param in _named_parameters(state.model):
                metrics[f"l2_norm/param/{name}"] = get_param_norm([param])
        logger.log_metrics(metrics)
