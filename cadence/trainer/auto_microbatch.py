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
from typing import Any, Callable, Optional, Union

import torch

from cadence.utils import dist
from cadence.core.state import State

__all__ = ["parse_microbatch_size", "forward_backward_auto", "is_out_of_memory", "any_rank",
           "alloc_retries", "release_after_oom"]

log = logging.getLogger(__name__)


def parse_microbatch_size(value: Union[int, str, None]) -> tuple[bool, Optional[int]]:
    """The Trainer's ``device_train_microbatch_size`` as ``(auto, size)``: ``'auto'`` gives
    ``(True, None)`` (the size is found at the first batch), a positive int ``n`` gives
    ``(False, n)``, None (the whole per-device batch) ``(False, None)``.

    Raises:
        ValueError: anything else, naming the value.
    """
    if value == "auto":
        return True, None
    if value is not None and (not isinstance(value, int) or value <= 0):
        raise ValueError(
            f"device_train_microbatch_size must be a positive int, 'auto' or None, got "
            f"{value!r}."
        )
    return False, value


def forward_backward_auto(state: State, batch_size: int,
                          accumulate: Callable[[int], torch.Tensor]) -> torch.Tensor:
    """``accumulate(size)`` (the gradients of one batch of ``batch_size`` samples, in
    microbatches of ``size``) at ``state.device_train_microbatch_size``, which starts at the
    whole batch; retried at half the size when any rank runs out of memory, and halved for
    the following batches when any rank's CUDA allocator had to retry. Every rank calls it.

    Returns:
        What ``accumulate`` returned (the batch's loss).

    Raises:
        RuntimeError: a microbatch of 1 sample ran out of memory (the model does not fit).
        Exception: whatever ``accumulate`` raised that is not an out-of-memory error.
    """
    if state.device_train_microbatch_size is None:
        state.device_train_microbatch_size = batch_size
        if state.device.type != "cuda":
            log.info("device_train_microbatch_size='auto': on %s the whole batch (%d) is "
                     "used unless it runs out of memory.", state.device.type, batch_size)
    while True:
        size = state.device_train_microbatch_size
        retries = alloc_retries(state.device)
        failure: Optional[BaseException] = None
        try:
            result = accumulate(size)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            failure = exc
        if any_rank(failure is not None, state.device):
            release_after_oom(state.model, state.optimizers, state.device)
            _lower_microbatch_size(state, size, "ran out of memory", failure)
            continue
        if any_rank(alloc_retries(state.device) > retries, state.device) and size > 1:
            _lower_microbatch_size(state, size, "made the CUDA allocator retry", None)
        return result


def _lower_microbatch_size(state: State, size: int, reason: str,
                           failure: Optional[BaseException]) -> None:
    if size <= 1:
        raise RuntimeError(f"A microbatch of 1 sample {reason}; the model does not fit "
                           f"on this device.") from failure
    state.device_train_microbatch_size = size // 2
    log.warning("device_train_microbatch_size='auto': a microbatch of %d %s; now %d.",
                size, reason, size // 2)


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
    """Free what a failed attempt held: gradients (with ``fsdp.sync_gradients:
    last_microbatch`` also FSDP2's unsharded ones, which the retry must not add to), FSDP2's
    gathered parameters, the cache."""
    from torch.distributed.fsdp import FSDPModule

    for optimizer in optimizers:
        optimizer.zero_grad(set_to_none=True)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
            # FSDP2 internals, read defensively
            group = getattr(module._get_fsdp_state(), "_fsdp_param_group", None)
            for fsdp_param in getattr(group, "fsdp_params", ()):
                fsdp_param.unsharded_accumulated_grad = None
                unsharded = getattr(fsdp_param, "_unsharded_param", None)
                if unsharded is not None:
                    unsharded.grad = None
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
