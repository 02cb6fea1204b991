"""The ``DeviceMesh`` a sharding strategy runs on.

``FULL_SHARD`` / ``SHARD_GRAD_OP``: a 1-D mesh ``(dp_shard=world,)``. ``NO_SHARD``: a 2-D mesh
``(dp_replicate=world, dp_shard=1)``. ``HYBRID_SHARD`` / ``HYBRID_SHARD_ZERO2``: a 2-D mesh
``(dp_replicate, dp_shard)``, by default one replica per node and sharding within a node
(``data_parallel_replicate_degree`` / ``data_parallel_shard_degree`` override it).

With ``tp.tensor_parallel_degree`` above 1, a ``tp`` dimension is added last (innermost:
the ranks of one tensor-parallel group are neighbours, on one node), and the data-parallel
dimensions above are built for ``world_size / tp`` ranks: ``(dp_shard, tp)``, or
``(dp_replicate, dp_shard, tp)`` for HYBRID strategies. Without fsdp the mesh is ``(tp,)``
and the world must be one tensor-parallel group.

With ``pp.pipeline_parallel_degree`` above 1, a ``pp`` dimension comes first (outermost:
``(pp, dp_replicate, dp_shard, tp)``, torchtitan's order) and everything above is built for
``world_size / pp`` ranks; without fsdp those must be one tensor-parallel group (or one rank).
Source: ``torch.distributed.device_mesh.init_device_mesh``; torchtitan's ``ParallelDims``.
"""

from __future__ import annotations

import dataclasses

from torch.distributed.device_mesh import DeviceMesh

from cadence.parallel.config import FSDPConfig, ParallelismConfig

__all__ = ["mesh_shape", "mesh_dims", "data_parallel_mesh"]


def mesh_shape(config: FSDPConfig, world_size: int, local_world_size: int) -> tuple[int, ...]:
    """The mesh shape for ``config`` on ``world_size`` ranks (``local_world_size`` per node).

    Raises:
        ValueError: the degrees do not multiply to the world size, or a 1-D strategy is given
            a replicate degree above 1 (naming the keys and the fix).
    """
    strategy = config.sharding_strategy
    replicate, shard = config.data_parallel_replicate_degree, config.data_parallel_shard_degree
    key = "parallelism_config.fsdp"
    if strategy in ("FULL_SHARD", "SHARD_GRAD_OP"):
        if replicate not in (-1, 1):
            raise ValueError(
                f"{key}.data_parallel_replicate_degree={replicate} needs a HYBRID sharding "
                f"strategy (HYBRID_SHARD or HYBRID_SHARD_ZERO2); {strategy} shards over all ranks."
            )
        if shard not in (-1, world_size):
            raise ValueError(
                f"{key}.data_parallel_shard_degree={shard} does not match the world size "
                f"{world_size} for {strategy}; leave it at -1, or use HYBRID_SHARD."
            )
        return (world_size,)
    if strategy == "NO_SHARD":
        if shard not in (-1, 1) or replicate not in (-1, world_size):
            raise ValueError(
                f"NO_SHARD replicates over every rank: leave {key}.data_parallel_shard_degree "
                f"and data_parallel_replicate_degree at -1 (got {shard} and {replicate})."
            )
        return (world_size, 1)
    if replicate == -1 and shard == -1:
        shard = min(local_world_size, world_size)
    if replicate == -1:
        replicate = world_size // shard if shard > 0 else -1
    if shard == -1:
        shard = world_size // replicate
    if replicate * shard != world_size:
        raise ValueError(
            f"{key}: data_parallel_replicate_degree ({replicate}) x data_parallel_shard_degree "
            f"({shard}) must equal the world size ({world_size})."
        )
    return (replicate, shard)


def mesh_dims(config: ParallelismConfig, world_size: int,
              local_world_size: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The mesh shape and dimension names for ``config`` on ``world_size`` ranks.

    Raises:
        ValueError: ``tensor_parallel_degree`` does not divide the world size (or the
            ranks per node), tp without fsdp on more ranks than one tp group, or bad fsdp
            degrees (see :func:`mesh_shape`); ``pipeline_parallel_degree`` does not divide the
            world size, or several data-parallel ranks per stage without fsdp.
    """
    pp = config.pp_degree
    if pp > 1:
        key = "parallelism_config.pp.pipeline_parallel_degree"
        if world_size % pp != 0:
            raise ValueError(f"{key}={pp} does not divide the world size {world_size}; use a "
                             f"divisor of {world_size}.")
        inner = world_size // pp
        if config.fsdp is None and inner > config.tp_degree:
            raise ValueError(
                f"{key}={pp} on {world_size} ranks leaves {inner // config.tp_degree} "
                f"data-parallel ranks per stage, which need parallelism_config.fsdp: {{}} "
                f"(sharding_strategy NO_SHARD to replicate); or set {key}={world_size}.")
        shape, names = mesh_dims(dataclasses.replace(config, pp=None), inner,
                                 min(local_world_size, inner))
        return (pp, *shape), ("pp", *names)
    tp = config.tp_degree
    key = "parallelism_config.tp.tensor_parallel_degree"
    if world_size % tp != 0:
        raise ValueError(f"{key}={tp} does not divide the world size {world_size}; use a "
                         f"divisor of {world_size}.")
    if tp > 1 and local_world_size % tp != 0 and local_world_size < world_size:
        raise ValueError(f"{key}={tp} does not divide the {local_world_size} ranks per node; a "
                         f"tensor-parallel group must sit on one node.")
    if config.fsdp is None:
        if tp == 1:
            return (world_size,), ("dp_replicate",)
        if world_size != tp:
            raise ValueError(
                f"{key}={tp} on {world_size} ranks without fsdp: the {world_size // tp} "
                f"tensor-parallel groups need data parallelism over them; add "
                f"parallelism_config.fsdp: {{}} (sharding_strategy NO_SHARD to replicate).")
        return (tp,), ("tp",)
    dp_world, dp_local = world_size // tp, max(1, local_world_size // tp)
    shape = mesh_shape(config.fsdp, dp_world, dp_local)
    names: tuple[str, ...] = ("dp_shard",) if len(shape) == 1 else ("dp_replicate", "dp_shard")
    if tp > 1:
        shape, names = (*shape, tp), (*names, "tp")
    return shape, names


def data_parallel_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The data-parallel part of ``mesh`` (every dimension but ``tp`` and ``pp``), for FSDP2."""
    names = tuple(n for n in (mesh.mesh_dim_names or ()) if n not in ("tp", "pp"))
    if names == tuple(mesh.mesh_dim_names or ()):
        return mesh
    return mesh[names] if len(names) > 1 else mesh[names[0]]
