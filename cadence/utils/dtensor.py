"""DTensor helpers for code that works on plain tensors and on the DTensors that FSDP2 and
tensor parallelism make (EMA, child-tuning, gradient norms, finite checks, memory counts,
streamed weights, layout-invariant init), one function per idea; each takes a plain tensor
too and then does the single-process thing.

- :func:`local_tensor`: this rank's shard; :func:`local_chunk`: the shard and where it sits
  in the full tensor.
- :func:`full_tensor`: the whole tensor on every rank (a collective).
- :func:`dtensor_like`: a local shard back as a DTensor laid out like another;
  :func:`shard_like`: a full tensor cut into this rank's shard of another's layout.
- :func:`is_shard_placement`, :func:`shard_index`, :func:`replication_weight`: the layout's
  geometry (which placements split, which shard this rank holds, how many ranks hold it).

Source: ``torch.distributed.tensor`` (PyTorch): ``DTensor.to_local``, ``DTensor.from_local``,
``DTensor.full_tensor``, ``distribute_tensor``.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch.distributed.tensor import DTensor, distribute_tensor

from cadence.utils import dist

__all__ = ["dtensor_like", "full_tensor", "is_shard_placement", "local_chunk", "local_tensor",
           "replication_weight", "shard_index", "shard_like"]


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


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole of ``tensor`` as a plain tensor: a DTensor's ``full_tensor()`` (a collective
    on its mesh: call on every rank of it), a plain tensor itself.

    Args:
        tensor: a plain tensor or a DTensor (e.g. the norm of sharded gradients).

    Returns:
        A plain tensor of ``tensor``'s global shape, the same on every rank.
    """
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def dtensor_like(reference: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """``local`` (this rank's shard) as a DTensor laid out like ``reference``: its mesh,
    placements, global shape and stride; ``local`` itself when ``reference`` is a plain
    tensor. No communication, nothing checked (``run_check=False``).

    Args:
        reference: the tensor whose layout to take (e.g. a parameter).
        local: a plain tensor of ``local_tensor(reference)``'s shape; the DTensor shares its
            storage.
    """
    if not isinstance(reference, DTensor):
        return local
    return DTensor.from_local(local, reference.device_mesh, reference.placements,
                              run_check=False, shape=reference.shape, stride=reference.stride())


def shard_like(reference: torch.Tensor, tensor: torch.Tensor,
               dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """A copy of ``tensor`` on ``reference``'s device and in its layout, for state saved
    beside a model's tensors and loaded back (EMA weights, child-tuning masks).

    A full tensor (every rank holds the same one, as after loading a ``full`` checkpoint) is
    cut into this rank's shard locally (``distribute_tensor(..., src_data_rank=None)``: no
    communication); a DTensor (from a ``sharded`` checkpoint, loaded into a placeholder laid
    out like ``reference``) is copied as it is.

    Args:
        reference: the model's tensor the copy is laid out like (plain or DTensor).
        tensor: the saved value: a full tensor of ``reference``'s global shape, or a DTensor.
        dtype: the copy's dtype; default ``tensor``'s.

    Returns:
        A new tensor (not sharing ``tensor``'s storage): a DTensor if ``reference`` or
        ``tensor`` is one, else a plain tensor on ``reference``'s device.

    Raises:
        ValueError: a full ``tensor`` whose shape is not ``reference``'s.
    """
    if isinstance(tensor, DTensor):
        return tensor.detach().to(dtype=dtype or tensor.dtype, copy=True)
    if tuple(tensor.shape) != tuple(reference.shape):
        raise ValueError(f"shape {tuple(tensor.shape)} does not match the model's "
                         f"{tuple(reference.shape)}")
    tensor = tensor.detach().to(device=local_tensor(reference).device, dtype=dtype)
    if isinstance(reference, DTensor):
        return distribute_tensor(tensor, reference.device_mesh, reference.placements,
                                 src_data_rank=None)
    return tensor.clone()


def is_shard_placement(placement: Any) -> bool:
    """Whether a DTensor placement splits the tensor: ``Shard``, or the ``_StridedShard``
    FSDP2 uses on the data-parallel dimension of a parameter that TP already shards on the
    same tensor dimension (``_StridedShard.is_shard()`` is False)."""
    from torch.distributed.tensor.placement_types import _StridedShard

    return bool(placement.is_shard()) or isinstance(placement, _StridedShard)


def shard_index(tensor: torch.Tensor) -> int:
    """Which shard of its full tensor this rank holds: 0 for a plain tensor (and for a rank
    outside the mesh); replicas of the same shard (DDP, the replicate dimension of
    HYBRID_SHARD) get the same index. Shards are numbered row-major over the mesh's
    splitting dimensions."""
    if not isinstance(tensor, DTensor):
        return 0
    mesh, coordinate = tensor.device_mesh, tensor.device_mesh.get_coordinate()
    if coordinate is None:
        return 0
    index = 0
    for dim, placement in enumerate(tensor.placements):
        if is_shard_placement(placement):  # Shard, or FSDP2's _StridedShard over TP
            index = index * mesh.size(dim) + coordinate[dim]
    return index


def replication_weight(tensor: torch.Tensor) -> float:
    """``1 / (ranks holding each of this rank's entries)``: summing per-rank counts weighted
    by it over all ranks counts every global entry once. A plain tensor is taken to be held
    whole by every rank of the world (``1 / world_size``); a DTensor's replicas are the mesh
    ranks that differ only on non-splitting dimensions."""
    if isinstance(tensor, DTensor):
        mesh = tensor.device_mesh
        shards = math.prod(mesh.size(d) for d, p in enumerate(tensor.placements)
                           if is_shard_placement(p))
        return shards / mesh.size()
    return 1.0 / dist.get_world_size()
