"""How many bytes of model state this rank holds: the measure behind "FSDP shards the
parameters, gradients and optimizer state" (local shards of DTensors, not the full tensors)."""

from __future__ import annotations

import torch

from cadence.utils.dtensor import local_tensor

__all__ = ["local_state_bytes"]


def _nbytes(tensor: torch.Tensor) -> int:
    local = local_tensor(tensor)
    return local.numel() * local.element_size()


def local_state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """This rank's bytes of ``params``, ``grads`` and ``optimizer`` state (tensors of one or
    more dimensions, e.g. Adam's moments; scalar step counters are left out)."""
    params = list(model.parameters())
    return {
        "params": sum(_nbytes(p) for p in params),
        "grads": sum(_nbytes(p.grad) for p in params if p.grad is not None),
        "optimizer": sum(_nbytes(v) for state in optimizer.state.values() for v in state.values()
                         if isinstance(v, torch.Tensor) and v.dim() > 0),
    }
