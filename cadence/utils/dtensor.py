"""Reading a DTensor's local shard: the helpers for code that works on plain tensors and on
the DTensors that FSDP2 and tensor parallelism make (EMA, child-tuning, memory counts,
broadcasts, streamed weights, layout-invariant init): :func:`local_tensor` (the shard) and
:func:`local_chunk` (the shard and where it sits in the full tensor).

Source: ``torch.distributed.tensor.DTensor.to_local`` (PyTorch).
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

__all__ = ["local_chunk", "local_tensor"]


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


def local_chunk(tensor: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    """This rank's part of ``tensor`` and where it starts in the full tensor.

    Args:
        tensor: a plain tensor (the whole tensor is local) or a DTensor (FSDP2 ``Shard``,
            TP ``Shard``/``Replicate``, FSDP x TP ``_StridedShard``; each rank's part is a
            rectangle of the full tensor).

    Returns:
        ``(local, offsets)``: the local tensor, sharing the parameter's storage (write into
        it in place), and the global index of its first element along each dimension.

    Raises:
        ValueError: the placements give a local shape other than the local tensor's (a
            layout this loader cannot slice).
    """
    if not isinstance(tensor, DTensor):
        return tensor, (0,) * tensor.dim()
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    local = tensor.to_local()
    shape, offsets = compute_local_shape_and_global_offset(
        tensor.shape, tensor.device_mesh, tensor.placements)
    if tuple(shape) != tuple(local.shape):
        raise ValueError(
            f"Cannot slice a checkpoint into a DTensor with placements {tensor.placements}: "
            f"the local shape {tuple(local.shape)} is not {tuple(shape)}."
        )
    if len(offsets) != tensor.dim():  # a rank outside the mesh holds nothing
        offsets = (0,) * tensor.dim()
    return local, tuple(int(o) for o in offsets)


# ----------------------------------------------------------------------------- key plan
