"""Load a ``full`` checkpoint's optimizer state, including optimizers that keep no tensors.

``torch.distributed.checkpoint.state_dict.set_optimizer_state_dict`` with
``full_state_dict=True`` copies each full tensor into the optimizer's (possibly sharded)
state and takes the device to copy to from that state's first tensor of one or more
dimensions. An optimizer that keeps no such tensor (``torch.optim.SGD`` without momentum:
its state is empty; any optimizer whose state holds only scalars) has none, and torch stops
with ``AssertionError: Expected device to be set``. Such a state has nothing to shard or
copy: its parameter groups (learning rates, ...) and scalars are the same on every rank, so
rank 0 broadcasts it as a small object and every rank loads it as a local state dict.

Source: PyTorch ``torch/distributed/checkpoint/state_dict.py`` (``_load_optim_state_dict``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

from cadence.utils import dist

__all__ = ["set_full_optimizer_state"]


def _holds_tensors(obj: Any) -> bool:
    """Whether ``obj`` (nested dicts / lists) holds a tensor of one or more dimensions."""
    if isinstance(obj, torch.Tensor):
        return obj.dim() > 0
    if isinstance(obj, dict):
        return any(_holds_tensors(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(_holds_tensors(v) for v in obj)
    return False


def set_full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                             full_state: dict[str, Any], broadcast: bool) -> None:
    """Load ``full_state`` (a ``full`` checkpoint's optimizer state, keyed by parameter
    name, as ``get_optimizer_state_dict(full_state_dict=True)`` wrote it) into
    ``optimizer``, whose parameters may be sharded (DTensors). Call on every rank.

    Args:
        model: the module the optimizer's parameters belong to.
        optimizer: the optimizer to load into.
        full_state: the state on rank 0; with ``broadcast``, other ranks pass ``{}``.
        broadcast: rank 0 alone holds ``full_state`` (more than one rank); it is sent to
            the others (tensors by ``broadcast_from_rank0``, a tensor-free state as one
            pickled object).
    """
    # Rank 0 decides, so every rank takes the same path (both paths are collectives).
    tensor_free = [None if _holds_tensors(full_state) else full_state]
    if broadcast:
        dist.broadcast_object_list(tensor_free)
    if tensor_free[0] is None:
        set_optimizer_state_dict(model, optimizer, full_state, options=StateDictOptions(
            full_state_dict=True, cpu_offload=True, broadcast_from_rank0=broadcast))
    else:  # nothing to shard: the same small state dict loads locally on every rank
        set_optimizer_state_dict(model, optimizer, tensor_free[0],
                                 options=StateDictOptions(full_state_dict=False))
