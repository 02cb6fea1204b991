"""``device_train_microbatch_size='auto'``: find the largest microbatch that trains cleanly.

Start at the whole per-device batch. When a batch runs out of memory, every rank lowers the
microbatch size together (half), frees what the failed attempt held (FSDP2 units are
resharded, gradients dropped) and retries the batch. On CUDA, a batch during which the
caching allocator had to retry (free its cache and allocate again, ``num_alloc_retries``)
also lowers the size for the following batches: such a batch "fits", but each retry
synchronises the device and costs throughput (transformer_central lesson 5, ~25%).

Limits: every rank must fail at the same microbatch (true when ranks see batches of the same
shape); a rank that runs out of memory inside a collective that the others completed
cannot be recovered by any trainer. Source: Composer's ``device_train_microbatch_size='auto'``
(``composer/trainer/trainer.py``), extended to FSDP2 and allocator retries.
"""

from __future__ import annotations

import gc
import logging
from typing import Any

import torch

from cadence.trainer import dist

__all__ = ["is_out_of_memory", "any_rank", "alloc_retries", "release_after_oom"]

log = logging.getLogger(__name__)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an out-of-memory error (CUDA's, or a RuntimeError saying so)."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def any_rank(flag: bool, device: torch.device) -> bool:
    """True on every rank if ``flag`` is true on any rank (an all-reduce of one number)."""
    if dist.get_world_size() <= 1:
        return flag
    value = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(value, "max")
    return bool(value.item() > 0)


def alloc_retries(device: torch.device) -> int:
    """The CUDA caching allocator's ``num_alloc_retries`` so far (0 off CUDA)."""
    if device.type != "cuda":
        return 0
    return int(torch.cuda.memory_stats(device).get("num_alloc_retries", 0))


def release_after_oom(model: torch.nn.Module, optimizers: list[Any], device: torch.device) -> None:
    """Free what a failed attempt held: gradients, FSDP2's gathered parameters, the cache."""
    from torch.distributed.fsdp import FSDPModule

    for optimizer in optimizers:
        optimizer.zero_grad(set_to_none=True)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
