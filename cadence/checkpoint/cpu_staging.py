"""Staging a checkpoint's state in CPU memory for a background writer: whole tensors
(:func:`copy_to_cpu`), or, for a ``full`` save on several ranks, each rank's shards, gathered
to rank 0 later in the writer thread (:func:`stage_local_shards`, :func:`gather_to_rank0`).

The synchronous ``full`` save gathers the model and optimizer to rank 0 inside the loop
(``get_model_state_dict`` / ``get_optimizer_state_dict`` with ``full_state_dict=True``, a
collective over the default group). The asynchronous one splits that in two:

1. In the loop, every rank (:func:`stage_local_shards`): the sharded state dicts
   (``full_state_dict=False``: the same FQN keys, parameter groups and plain tensors, with
   DTensors where the full save has full tensors); each DTensor's local shard is copied to
   CPU memory with the full tensor's shape and the row its shard starts at; rank 0 copies
   the plain tensors too (the full save takes those from rank 0).
2. In the writer thread, a collective over the checkpoint-only gloo group
   (:func:`gather_to_rank0`): the ranks share their shard lists (shapes and rows, no data)
   and check that the shards tile each tensor's rows exactly once; then every rank sends
   its shards to rank 0, which receives each straight into its rows of the full tensor
   (``torch.distributed`` ``isend`` / ``irecv``; empty shards are skipped).

The result holds the same keys and tensor values as the synchronous save's (``torch.equal``
on every tensor; a checkpoint test checks it). Restricted to DTensors it provably rebuilds
(:func:`rows_sharded`): a one-dimensional mesh of every rank, placement ``Shard(0)``, rows
split as ``torch.chunk`` does (possibly uneven or empty), which is how FSDP2 ``fully_shard``
shards. Anything else (tensor parallel, HSDP's 2-D mesh) is gathered in the loop as the
synchronous save does.

Source: PyTorch ``torch.distributed.checkpoint.state_dict`` (``_gather_state_dict``: what
``full_state_dict=True`` does), ``DTensor.__create_chunk_list__`` (each shard's offset, as
DCP reads it), FSDP2's ``fully_shard`` (``Shard(0)`` on a 1-D mesh).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Optional

import torch
import torch.distributed as torch_dist
from torch.distributed.tensor import DTensor, Shard

from cadence.utils import dist

__all__ = ["LocalShard", "copy_to_cpu", "gather_to_rank0", "rows_sharded",
           "stage_local_shards"]

KeyPath = tuple[Any, ...]  # the keys from a state dict's root to a value


def copy_to_cpu(obj: Any, reuse: Any = None) -> Any:
    """``obj`` with every tensor replaced by a copy in CPU memory (dicts, lists and tuples
    walked; other values kept): the snapshot a background writer may read while training
    changes the originals.

    Args:
        obj: the tensors to copy (a state dict).
        reuse: an earlier result for an ``obj`` of the same layout, no longer read by anyone:
            each tensor of the same type, shape, dtype (and DTensor placements) is copied
            into in place. Copying into memory already touched is several times faster than
            into fresh memory (which the kernel must map and zero first).
    """
    if isinstance(obj, torch.Tensor):
        src = obj.detach()
        if (isinstance(reuse, torch.Tensor) and type(reuse) is type(src)
                and reuse.shape == src.shape and reuse.dtype == src.dtype
                and reuse.device.type == "cpu"
                and getattr(reuse, "placements", None) == getattr(src, "placements", None)):
            return reuse.copy_(src)
        return src.to("cpu", copy=True)
    if isinstance(obj, dict):
        old = reuse if isinstance(reuse, dict) else {}
        return {k: copy_to_cpu(v, old.get(k)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        olds = list(reuse) if isinstance(reuse, (list, tuple)) and len(reuse) == len(obj) else (
            [None] * len(obj))
        return type(obj)(copy_to_cpu(v, r) for v, r in zip(obj, olds))
    return obj


@dataclass
class LocalShard:
    """This rank's rows of a row-sharded DTensor, copied to CPU memory.

    Attributes:
        rows: ``[local rows, *shape[1:]]``, CPU, contiguous; 0 rows when this rank holds none.
        shape: the full tensor's shape.
        start: the index of ``rows``' first row in the full tensor.
    """

    rows: torch.Tensor
    shape: torch.Size
    start: int


def rows_sharded(tensor: Any) -> bool:
    """Whether ``tensor`` is a DTensor that :func:`gather_to_rank0` rebuilds: on a
    one-dimensional mesh of every rank (of more than one), placed ``Shard(0)`` (FSDP2's
    ``fully_shard`` on a 1-D mesh)."""
    if not isinstance(tensor, DTensor) or tensor.dim() == 0:
        return False
    mesh, placements = tensor.device_mesh, tuple(tensor.placements)
    world = dist.get_world_size()
    return (world > 1 and mesh.ndim == 1 and mesh.size() == world and len(placements) == 1
            and type(placements[0]) is Shard and placements[0].dim == 0)


def stage_local_shards(obj: Any, keep_plain: bool, reuse: Any = None) -> Any:
    """``obj`` (a sharded state dict, every rank) with each :func:`rows_sharded` DTensor
    replaced by its :class:`LocalShard` and, with ``keep_plain`` (rank 0), every other tensor
    by a CPU copy (without: by None). Any other DTensor is gathered here, as the synchronous
    save does (``full_tensor()``, a collective on its mesh). Blocks only while copying.

    Args:
        obj: the state dict (dicts, lists and tuples walked; other values kept).
        keep_plain: copy the tensors that are not row-sharded (rank 0, which writes them).
        reuse: the previous result for the same layout, no longer read by anyone: its
            buffers are copied into (see :func:`copy_to_cpu`).
    """
    if isinstance(obj, DTensor) and rows_sharded(obj):
        chunks = obj.__create_chunk_list__()  # this rank's offset, as DCP reads it
        assert len(chunks) == 1, f"one shard per rank expected, got {chunks}"
        old = reuse.rows if isinstance(reuse, LocalShard) else None
        return LocalShard(copy_to_cpu(obj.to_local(), old).contiguous(), obj.shape,
                          int(chunks[0].offsets[0]))
    if isinstance(obj, DTensor):
        obj = obj.full_tensor()
    if isinstance(obj, torch.Tensor):
        return copy_to_cpu(obj, reuse) if keep_plain else None
    if isinstance(obj, dict):
        old = reuse if isinstance(reuse, dict) else {}
        return {k: stage_local_shards(v, keep_plain, old.get(k)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        olds = list(reuse) if isinstance(reuse, (list, tuple)) and len(reuse) == len(obj) else (
            [None] * len(obj))
        return type(obj)(stage_local_shards(v, keep_plain, r) for v, r in zip(obj, olds))
    return obj


def _leaves(obj: Any, path: KeyPath = ()) -> Iterator[tuple[KeyPath, Any]]:
    """``(path, value)`` of every value that is not a dict, list or tuple, in order."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _leaves(value, path + (key,))
    elif isinstance(obj, (list, tuple)):
        for index, value in enumerate(obj):
            yield from _leaves(value, path + (index,))
    else:
        yield path, obj


def _replace(obj: Any, full: dict[KeyPath, torch.Tensor], path: KeyPath = ()) -> Any:
    """``obj`` with the value at each path of ``full`` replaced by ``full``'s."""
    if path in full:
        return full[path]
    if isinstance(obj, dict):
        return {k: _replace(v, full, path + (k,)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_replace(v, full, path + (i,)) for i, v in enumerate(obj))
    return obj


def _name(path: KeyPath) -> str:
    return "/".join(str(key) for key in path)


def _check_tiling(layouts: list[list[tuple[Any, ...]]]) -> None:
    """Every rank lists the same tensors (path, shape, dtype), and for each tensor the
    ranks' rows ``(start, count)`` cover ``0 .. shape[0]`` exactly once.

    Raises:
        RuntimeError: they do not (names the tensor and each rank's rows).
    """
    first = [entry[:3] for entry in layouts[0]]
    for rank, layout in enumerate(layouts):
        if [entry[:3] for entry in layout] != first:
            raise RuntimeError(
                f"The ranks' sharded checkpoint states differ (rank 0 lists "
                f"{[_name(e[0]) for e in layouts[0]][:8]}..., rank {rank} "
                f"{[_name(e[0]) for e in layout][:8]}...): cannot gather them to rank 0.")
    for index, (path, shape, _) in enumerate(first):
        pieces = sorted((layout[index][3], layout[index][4]) for layout in layouts)
        row = 0
        for start, count in pieces:
            if count == 0:
                continue
            if start != row:
                break
            row += count
        if row != shape[0] or sum(count for _, count in pieces) != shape[0]:
            raise RuntimeError(
                f"The ranks' shards of {_name(path)} (shape {list(shape)}) do not cover its "
                f"rows exactly once: (start, rows) per rank "
                f"{[(layout[index][3], layout[index][4]) for layout in layouts]}.")


def gather_to_rank0(staged: Any, group: Any, reuse: Any = None) -> Optional[Any]:
    """Rank 0: ``staged`` (from :func:`stage_local_shards`) with each :class:`LocalShard`
    replaced by the full tensor, every rank's rows in place; other ranks: None. A collective
    over ``group`` (a gloo group of every rank, in global rank order): call on every rank.

    Args:
        staged: this rank's :func:`stage_local_shards` result.
        group: the process group to gather over (CPU tensors: gloo).
        reuse: rank 0's previous result for the same layout, no longer read by anyone: full
            tensors of the same shape and dtype are received into.

    Raises:
        RuntimeError: the ranks' shards do not tile a tensor's rows exactly once (names
            it), raised on every rank before any data is sent.
    """
    shards = [(path, leaf) for path, leaf in _leaves(staged) if isinstance(leaf, LocalShard)]
    mine = [(path, tuple(s.shape), s.rows.dtype, s.start, s.rows.shape[0]) for path, s in shards]
    layouts: list[Any] = [None] * torch_dist.get_world_size(group)
    torch_dist.all_gather_object(layouts, mine, group=group)
    _check_tiling(layouts)
    rank = torch_dist.get_rank(group)
    works = []
    if rank != 0:
        for tag, (_, shard) in enumerate(shards):
            if shard.rows.shape[0]:
                works.append(torch_dist.isend(shard.rows, group_dst=0, group=group, tag=tag))
        for work in works:
            work.wait()
        return None
    previous = dict(_leaves(reuse)) if reuse is not None else {}
    full: dict[KeyPath, torch.Tensor] = {}
    for tag, (path, shard) in enumerate(shards):
        old = previous.get(path)
        out = (old if isinstance(old, torch.Tensor) and old.shape == shard.shape
               and old.dtype == shard.rows.dtype and old.is_contiguous()
               else torch.empty(shard.shape, dtype=shard.rows.dtype))
        for src, layout in enumerate(layouts):
            start, count = layout[tag][3], layout[tag][4]
            if count == 0:
                continue
            rows = out.narrow(0, start, count)  # contiguous: whole rows of a contiguous tensor
            if src == 0:
                rows.copy_(shard.rows)
            else:
                works.append(torch_dist.irecv(rows, group_src=src, group=group, tag=tag))
        full[path] = out
    for work in works:
        work.wait()
    return _replace(staged, full)
