"""The :class:`OptimizerMonitor` callback: L2 norms of the gradients and of the parameters.

Source: MosaicML Composer's ``OptimizerMonitor`` (``composer/callbacks/optimizer_monitor.py``);
the norms come from :func:`~cadence.parallel.grad_norm.get_grad_norm` and
:func:`~cadence.parallel.grad_norm.get_param_norm`, which are correct under DDP and
FSDP2 (they reduce DTensor shards over the mesh).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Iterator, Union

import torch

from cadence.core import Callback, Time, TimeUnit
from cadence.parallel.grad_norm import get_grad_norm, get_param_norm
from cadence.registry import callbacks
from cadence.utils.dtensor import full_tensor
from cadence.utils.misc import unwrap_model

if TYPE_CHECKING:
    from cadence.core import State

__all__ = ["OptimizerMonitor"]


def _named_parameters(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Parameter]]:
    """The model's parameters under the user's names (without DDP's ``module.`` prefix)."""
    return unwrap_model(model).named_parameters()


@callbacks.register("optimizer_monitor")
class OptimizerMonitor(Callback):
    """Logs the global L2 norm of the gradients and of the parameters every
    ``batch_log_interval`` steps, and the optimizer's own per-parameter metrics.

    - ``l2_norm/grad/global``: the norm of all gradients together, read at
      ``AFTER_TRAIN_BATCH``, where the gradients are final for the step (accumulated over
      microbatches, all-reduced by DDP or reduce-scattered by FSDP) and the optimizer has
      not stepped yet. Algorithms run before callbacks on an event, so with
      :class:`~cadence.algorithms.GradientClipping` this is the norm *after* clipping (as in
      Composer). Under AMP fp16 the trainer's gradients at that point are still multiplied
      by the loss scale.
    - ``l2_norm/param/global``: the norm of all parameters, read at ``BATCH_END`` (after the
      optimizer step: the weights the next batch uses).
    - with ``log_per_layer`` (default, as Composer always does): ``l2_norm/grad/<param
      name>`` for every parameter with a gradient, and ``l2_norm/param/<param name>`` for
      every parameter (names as in the unwrapped model's ``named_parameters``).
    - with ``log_optimizer_metrics`` and an optimizer that has
      ``report_per_parameter_metrics(param, name, metrics)`` (e.g.
      :class:`~cadence.optim.decoupled_weight_decay.DecoupledAdamW`): what it reports per parameter,
      e.g. ``l2_norm/moment/<name>``, ``l2_norm/update/<name>``, read at ``BATCH_END``.

    All ranks get the same values (the norms are reduced over the ranks under FSDP), and
    every rank must run this callback (under FSDP it runs collectives). Nothing is computed
    on other steps; on a logging step the global norms stay on the device until a logger
    destination writes them, so the callback itself adds no host sync. Per-layer and
    optimizer metrics under FSDP cost a small all-reduce per parameter on logging steps.

    Differences from Composer's ``OptimizerMonitor``, on purpose: the parameter norms are
    added; ``log_per_layer=False`` leaves out the per-parameter norms (one metric, and under
    FSDP one small all-reduce, per parameter per logged step), which Composer always logs.

    Args:
        log_optimizer_metrics: log the optimizer's per-parameter metrics; default True
            (Composer's).
        batch_log_interval: log at steps that are multiples of this (Composer's); default 10.
        log_per_layer: also log each parameter's gradient and weight norm; default True
            (Composer logs the gradient norms always).
        log_interval: deprecated name of ``batch_log_interval`` (an ``int`` or ``"10ba"``).

    Raises:
        ValueError: the interval is not a positive number of batches.
    """

    def __init__(self, log_optimizer_metrics: bool = True,
                 batch_log_interval: Union[int, str, Time] = 10, *,
                 log_per_layer: bool = True,
                 log_interval: Union[int, str, Time, None] = None) -> None:
        if log_interval is not None:
            warnings.warn("OptimizerMonitor(log_interval=) is deprecated; use "
                          "batch_log_interval= (Composer's name).", DeprecationWarning,
                          stacklevel=2)
            batch_log_interval = log_interval
        interval = Time.from_input(batch_log_interval, TimeUnit.BATCH)
        if interval.unit != TimeUnit.BATCH or interval.value < 1:
            raise ValueError(
                f"OptimizerMonitor batch_log_interval must be a positive number of batches "
                f"(e.g. 10 or '10ba'); got {batch_log_interval!r}."
            )
        self.log_optimizer_metrics = bool(log_optimizer_metrics)
        self.batch_log_interval = int(interval.value)
        self.log_per_layer = bool(log_per_layer)
        self._grad_norms: dict[str, torch.Tensor] = {}  # computed at AFTER_TRAIN_BATCH

    @property
    def log_interval(self) -> int:
        """Deprecated alias of :attr:`batch_log_interval`."""
        return self.batch_log_interval

    def _due(self, step: int) -> bool:
        return step % self.batch_log_interval == 0

    def after_train_batch(self, state: State, logger: Any) -> None:
        del logger
        self._grad_norms = {}
        if not self._due(int(state.timestamp.batch) + 1):  # the step this batch completes
            return
        norms = {"l2_norm/grad/global": get_grad_norm(state.model.parameters())}
        if self.log_per_layer:
            for name, param in _named_parameters(state.model):
                if param.grad is not None:
                    norms[f"l2_norm/grad/{name}"] = get_grad_norm([param])
        self._grad_norms = norms

    def batch_end(self, state: State, logger: Any) -> None:
        if not self._due(int(state.timestamp.batch)):
            return
        metrics: dict[str, Any] = dict(self._grad_norms)
        self._grad_norms = {}
        metrics["l2_norm/param/global"] = get_param_norm(state.model.parameters())
        if self.log_per_layer:
            for name, param in _named_parameters(state.model):
                metrics[f"l2_norm/param/{name}"] = get_param_norm([param])
        reporter = getattr(state.optimizers[0], "report_per_parameter_metrics", None) \
            if state.optimizers else None
        if self.log_optimizer_metrics and callable(reporter):
            reported: dict[str, Any] = {}
            for name, param in _named_parameters(state.model):
                if param.requires_grad:
                    reported = reporter(param, name, reported)
            metrics.update({key: full_tensor(value) for key, value in reported.items()
                            if key not in metrics})
        logger.log_metrics(metrics)
