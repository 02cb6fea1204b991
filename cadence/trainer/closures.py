"""Optimizer steps that run the batch's forward and backward themselves (closures).

An optimizer whose ``_step_supports_amp_closure`` attribute is true (Composer's flag;
:class:`~cadence.algorithms.sam.sam.SAMOptimizer`) gets ``step(closure=...)``: the closure zeroes
the gradients, runs every microbatch's forward and backward, unscales the gradients (with a
gradient scaler) and fires ``AFTER_TRAIN_BATCH``, and returns the batch's loss (a 0-d
tensor), or ``None`` when a gradient scaler found inf/nan in the gradients (on any rank), in
which case the optimizer should not step. The optimizer may call it more than once per step
(SAM: twice). Other optimizers are stepped after one forward-backward, as before.

The closure takes Composer's keyword arguments:

- ``ddp_sync`` (default True): False keeps each rank's gradient local (DDP ``no_sync`` for
  every microbatch). FSDP2 cannot hold a whole local gradient without its reduction, so
  there it is ignored: the gradient is the global one.
- ``loss_dict`` (default None): a dict to receive this pass's loss under
  ``"loss/train/total"`` instead of ``state.total_loss`` (SAM's second pass, whose loss at
  the perturbed weights is not the step's loss).

With ``amp_fp16`` a ``torch.amp.GradScaler`` unscales each pass's gradients once: before each
call of the closure the scaler's record for the optimizer is reset to "ready" (what
Composer's ``ClosureGradScaler`` does), and the scale is updated once after the step, from
the last pass's inf/nan check.

Source: Composer's ``Trainer._use_closures`` / ``_train_batch``
(``composer/trainer/trainer.py``) and ``ClosureGradScaler``
(``composer/trainer/_scaler.py``); PyTorch ``torch.optim.Optimizer.step(closure)``.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Optional, Sequence

import torch
from torch.amp.grad_scaler import OptState

from cadence.utils import dist

__all__ = ["uses_closure", "step_with_closure", "sync_context"]

#: the closure the Trainer hands an optimizer: ``(ddp_sync=True, loss_dict=None) -> loss``
Closure = Callable[..., Optional[torch.Tensor]]


def uses_closure(optimizers: Sequence[torch.optim.Optimizer]) -> bool:
    """Whether the Trainer steps ``optimizers`` with a closure: any of them declares
    ``_step_supports_amp_closure``."""
    return any(getattr(opt, "_step_supports_amp_closure", False) for opt in optimizers)


def sync_context(model: torch.nn.Module, ddp_sync: bool) -> ContextManager[Any]:
    """The context a closure's forward-backward runs in: DDP's ``no_sync`` when
    ``ddp_sync`` is False, else nothing (FSDP2 and single-process models always reduce)."""
    if not ddp_sync and isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return model.no_sync()
    return contextlib.nullcontext()


def _found_inf(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> bool:
    """Whether the last unscale of ``optimizer``'s gradients found inf/nan, on any rank."""
    record = scaler._per_optimizer_states[id(optimizer)]  # torch keeps no public accessor
    flags = list(record["found_inf_per_device"].values())
    found = torch.stack([f.float().sum() for f in flags]).sum() if flags else torch.zeros(())
    if dist.get_world_size() > 1:
        dist.all_reduce(found, reduce_operation="sum")
    return bool(found.item() > 0)


def step_with_closure(optimizer: torch.optim.Optimizer, closure: Closure,
                      scaler: Optional[torch.amp.GradScaler]) -> Optional[torch.Tensor]:
    """``optimizer.step(closure)``, the closure wrapped for ``scaler`` (``amp_fp16``).

    Args:
        optimizer: an optimizer that declares ``_step_supports_amp_closure``.
        closure: the Trainer's forward-backward (see the module docstring); it unscales the
            gradients itself when there is a scaler.
        scaler: the run's gradient scaler, or None.

    Returns:
        What ``optimizer.step`` returns (SAM: the loss at the unperturbed weights).
    """
    if scaler is None or not scaler.is_enabled():
        return optimizer.step(closure=closure)

    def scaled_closure(**kwargs: Any) -> Optional[torch.Tensor]:
        scaler._per_optimizer_states[id(optimizer)]["stage"] = OptState.READY  # may unscale again
        loss = closure(**kwargs)
        return None if _found_inf(scaler, optimizer) else loss

    result = optimizer.step(closure=scaled_closure)
    scaler.update()
    return result
