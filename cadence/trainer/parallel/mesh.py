"""The ``DeviceMesh`` a sharding strategy runs on.

``FULL_SHARD`` / ``SHARD_GRAD_OP``: a 1-D mesh ``(dp_shard=world,)``. ``NO_SHARD``: a 2-D mesh
``(dp_replicate=world, dp_shard=1)``. ``HYBRID_SHARD`` / ``HYBRID_SHARD_ZERO2``: a 2-D mesh
``(dp_replicate, dp_shard)``, by default one replica per node and sharding within a node
(``data_parallel_replicate_degree`` / ``data_parallel_shard_degree`` override it).
Source: ``torch.distributed.device_mesh.init_device_mesh``; torchtitan's ``ParallelDims``.
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from cadence.trainer import dist
from cadence.trainer.parallel.config import FSDPConfig

__all__ = ["mesh_shape", "build_mesh"]


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


def build_mesh(config: FSDPConfig, device_type: str) -> DeviceMesh:
    """The ``DeviceMesh`` for ``config`` (needs an initialised process group)."""
    shape = mesh_shape(config, dist.get_world_size(), dist.get_local_world_size())
    names = ("dp_shard",) if len(shape) == 1 else ("dp_replicate", "dp_shard")
    return init_device_mesh(device_type, shape, mesh_dim_names=names)
