"""When gradients are reduced while one batch accumulates over microbatches.

- DDP: ``no_sync`` for every microbatch but the last, so gradients are all-reduced once
  per batch (Composer's default ``ddp_sync_strategy='single_auto_sync'``); with
  ``'multi_auto_sync'`` every microbatch's backward all-reduces (for models whose
  microbatches use different parameters).
- FSDP2, ``parallelism_config.fsdp.sync_gradients``:

  - ``every_microbatch`` (default; FSDP2's and torchtitan's behaviour): each unit's
    gradient is reduce-scattered after every microbatch's backward and accumulated in
    its shard, so a rank never holds more than one unit's unsharded gradient. Under HSDP
    (``HYBRID_SHARD``, ``NO_SHARD``: a ``dp_replicate`` mesh dimension) the all-reduce
    across replicas waits for the last microbatch (``set_requires_all_reduce(False)``
    before it): the reduce-scattered shards add up locally, and one all-reduce per unit
    per step gives the same sum.
  - ``last_microbatch``: ``set_requires_gradient_sync(False)`` for every microbatch but
    the last: no reduce-scatter or all-reduce until the last microbatch, which reduces
    the accumulated gradient once per unit. Collectives per step fall from
    ``microbatches x units`` reduce-scatters to ``units``; the price is memory: every rank
    keeps each unit's whole, unsharded gradient (in the reduce dtype, fp32 by default:
    4 bytes per parameter of the model) between microbatches, as DDP does, instead of
    ``4 / dp_shard`` bytes per parameter.

Gradients are equal either way (reduction is linear); only the communication and memory
differ. Source: PyTorch FSDP2 ``FSDPModule.set_requires_gradient_sync`` and
``set_requires_all_reduce``; torchtitan's gradient accumulation.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, ContextManager, Optional

import torch

if TYPE_CHECKING:
    from cadence.parallel.config import FSDPConfig

__all__ = ["GradientSync"]


class GradientSync:
    """The reduction switch of one (possibly wrapped) model, set per microbatch.

    Args:
        model: the model the Trainer runs forward on (``state.model``): a DDP module, an
            FSDP2 root (``fully_shard``), or a plain module (nothing to switch).
        fsdp: the run's ``parallelism_config.fsdp`` (its ``sync_gradients``: see the module
            docstring), or None (``every_microbatch``); only read for FSDP2.
        ddp_sync_strategy: ``single_auto_sync`` (default) or ``multi_auto_sync``; DDP only.

    Raises:
        ValueError: ``sync_gradients`` is neither value.
    """

    def __init__(self, model: torch.nn.Module, fsdp: Optional[FSDPConfig] = None,
                 ddp_sync_strategy: str = "single_auto_sync") -> None:
        from torch.distributed.fsdp import FSDPModule

        sync_gradients = "every_microbatch" if fsdp is None else fsdp.sync_gradients
        if sync_gradients not in ("every_microbatch", "last_microbatch"):
            raise ValueError(f"parallelism_config.fsdp.sync_gradients={sync_gradients!r} is not "
                             f"one of: every_microbatch, last_microbatch.")
        self.model = model
        self._ddp = isinstance(model, torch.nn.parallel.DistributedDataParallel) \
            and ddp_sync_strategy == "single_auto_sync"  # multi_auto_sync: never no_sync
        self._fsdp = isinstance(model, FSDPModule)
        self._every = sync_gradients == "every_microbatch"
        self._flags: Optional[tuple[bool, bool]] = None  # (gradient sync, all-reduce) as set

    def microbatch(self, last: bool) -> ContextManager[Any]:
        """The context one microbatch's forward and backward run in; ``last``: the batch's
        last microbatch, after whose backward the gradients must be reduced."""
        if self._ddp and not last:
            return self.model.no_sync()  # type: ignore[operator]
        if self._fsdp:
            self._set(gradient_sync=last or self._every, all_reduce=last)
        return contextlib.nullcontext()

    def _set(self, gradient_sync: bool, all_reduce: bool) -> None:
        """Set FSDP2's flags on every unit, only when they change (each call walks the
        modules)."""
        if self._flags == (gradient_sync, all_reduce):
            return
        self.model.set_requires_gradient_sync(gradient_sync)  # type: ignore[operator]
        self.model.set_requires_all_reduce(all_reduce)  # type: ignore[operator]
        self._flags = (gradient_sync, all_reduce)
