"""Reading a DTensor's local shard: the one helper for code that works on plain tensors and
on the DTensors that FSDP2 and tensor parallelism make (EMA, child-tuning, memory counts,
broadcasts).

Source: ``torch.distributed.tensor.DTensor.to_local`` (PyTorch).
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

__all__ = ["local_tensor"]


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of ``tensor`` if it is a DTensor, else ``tensor`` itself.

    The shard shares the DTensor's storage (``DTensor.to_local``), so writing into it in
    place writes the DTensor's local part.

    Args:
        tensor: a plain tensor or a DTensor.

    Returns:
        The local shard (a plain tensor), or ``tensor`` unchanged.
    """
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor
