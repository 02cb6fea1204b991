"""Count the collectives of a training step, by kind and mesh dimension.

:class:`CollectiveCounter` is a ``TorchDispatchMode``: every c10d collective a step issues
(FSDP2's all-gathers and reduce-scatters, tensor parallelism's all-reduces and
all-gathers, DDP's all-reduces, the gradient norm's all-reduce) passes through it with its
process group and its tensors; it records the count and the bytes of each, naming the
process group by the mesh dimension it belongs to. The op tables and the byte counts are
PyTorch's own (``torch.distributed._tools.fake_collectives.CollectiveOp``, which
``FSDPMemTracker`` and the runtime estimator use).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch.distributed._tools.fake_collectives import CollectiveOp, collective_ops, sync_ops
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["Collective", "CollectiveCounter", "group_names"]


@dataclass
class Collective:
    """One kind of collective on one mesh dimension, over a step.

    Attributes:
        dim: the mesh dimension (``dp_shard``, ``tp``, ...; ``world`` for the default group).
        op: the c10d op's name (``all_gather``, ``reduce_scatter``, ``all_reduce``, ...).
        group_size: ranks in the group.
        count: how many were issued.
        bytes: total bytes of the collective's tensor (the gathered output of an all-gather,
            the input of a reduce-scatter, the tensor of an all-reduce, the larger of an
            all-to-all's input and output, a send's or receive's tensor), summed over calls.
    """

    dim: str
    op: str
    group_size: int
    count: int = 0
    bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"dim": self.dim, "op": self.op, "group_size": self.group_size,
                "count": self.count, "bytes": self.bytes}


_OP_NAMES = {"allgather": "all_gather", "_allgather_base": "all_gather",
             "all_gather_into_tensor": "all_gather", "reduce_scatter": "reduce_scatter",
             "_reduce_scatter_base": "reduce_scatter",
             "reduce_scatter_tensor": "reduce_scatter", "allreduce": "all_reduce",
             "all_reduce": "all_reduce", "broadcast": "broadcast", "alltoall": "all_to_all",
             "alltoall_base": "all_to_all", "all_to_all_single": "all_to_all"}


def _op_name(func: torch._ops.OpOverload) -> str:
    name = func._opname.rstrip("_")
    for suffix in ("_out", "_coalesced"):
        name = name.removesuffix(suffix)
    return _OP_NAMES.get(name, name)


def group_names(mesh: Any) -> dict[str, str]:
    """``{process group name: mesh dimension}`` for every dimension of ``mesh`` (``None``:
    none), plus the default group as ``world``."""
    import torch.distributed as torch_dist

    names = {torch_dist.group.WORLD.group_name: "world"}  # type: ignore[union-attr]
    if mesh is not None:
        for dim in mesh.mesh_dim_names or ():
            names[mesh[dim].get_group().group_name] = dim
    return names


def _comm_bytes(func: Any, op: str, result: Any, args: Any, kwargs: Any) -> int:
    """The bytes of one call: PyTorch's count, except an all-to-all's, which is the larger
    of its input and output (PyTorch adds them for the functional op): what this rank
    sends, or receives, itself included."""
    if op != "all_to_all":
        return int(CollectiveOp.get_comm_tensor_size(func, result, args, kwargs))
    sizes = [t.untyped_storage().nbytes() for t in (*args[:2], result)
             if isinstance(t, torch.Tensor)]
    return max(sizes, default=0)


class CollectiveCounter(TorchDispatchMode):
    """Counts collectives while active (``with CollectiveCounter(group_names(mesh)):``).

    Args:
        names: process group name -> mesh dimension (:func:`group_names`); a group not in
            it is named ``group:<name>``.

    Attributes:
        collectives: one :class:`Collective` per (dimension, op), in first-seen order.
    """

    def __init__(self, names: Optional[dict[str, str]] = None) -> None:
        super().__init__()
        self.names = dict(names or {})
        self.collectives: dict[tuple[str, str], Collective] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if func in collective_ops and func not in sync_ops:
            group = CollectiveOp.get_process_group(func, args)
            dim = self.names.get(group.group_name, f"group:{group.group_name}")
            key = (dim, _op_name(func))
            entry = self.collectives.setdefault(key, Collective(dim, key[1], group.size()))
            entry.count += 1
            entry.bytes += _comm_bytes(func, key[1], result, args, kwargs)
        return result
