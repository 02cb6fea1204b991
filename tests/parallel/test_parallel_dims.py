"""``ParallelDims``: the degrees a ``parallelism_config`` makes on a world size, the
data-parallel size and rank, and the refusals (before anything is built)."""

from __future__ import annotations

import pytest

from cadence.parallel import FSDPConfig, ParallelDims, ParallelismConfig, TPConfig


def dims(config: ParallelismConfig, world: int, local: int = 8, rank: int = 0) -> ParallelDims:
    return ParallelDims.from_config(config, world_size=world, local_world_size=local,
                                    global_rank=rank)


def test_no_config_is_ddp_over_every_rank() -> None:
    d = dims(ParallelismConfig(), 4, rank=3)
    assert (d.dp_replicate, d.dp_shard, d.tp, d.dp_size, d.dp_rank) == (4, 1, 1, 4, 3)
    assert d.uses_ddp and not d.needs_mesh and not d.fsdp


def test_full_shard_and_hybrid() -> None:
    full = dims(ParallelismConfig(fsdp=FSDPConfig()), 8, rank=5)
    assert (full.dp_shard, full.dp_replicate, full.dp_rank) == (8, 1, 5)
    assert full.mesh_shape == (8,) and full.mesh_dim_names == ("dp_shard",)
    hybrid = dims(ParallelismConfig(fsdp=FSDPConfig(sharding_strategy="HYBRID_SHARD")), 8,
                  local=4)
    assert (hybrid.dp_replicate, hybrid.dp_shard, hybrid.dp_size) == (2, 4, 8)
    assert hybrid.mesh_dim_names == ("dp_replicate", "dp_shard")


def test_tp_is_innermost_and_ranks_of_a_tp_group_share_the_data_parallel_rank() -> None:
    config = ParallelismConfig(fsdp=FSDPConfig(), tp=TPConfig(tensor_parallel_degree=2))
    ranks = [dims(config, 8, rank=r) for r in range(8)]
    assert {d.dp_size for d in ranks} == {4} and ranks[0].mesh_shape == (4, 2)
    assert [d.dp_rank for d in ranks] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert ranks[0].describe() == "dp_replicate=1 dp_shard=4 tp=2 (8 ranks)"


def test_tp_alone_keeps_a_data_parallel_dimension_of_one() -> None:
    d = dims(ParallelismConfig(tp=TPConfig(tensor_parallel_degree=2)), 2)
    assert d.mesh_shape == (1, 2) and d.mesh_dim_names == ("dp_replicate", "tp")
    assert d.dp_size == 1 and not d.uses_ddp


@pytest.mark.parametrize("config, world, match", [
    (ParallelismConfig(tp=TPConfig(tensor_parallel_degree=3)), 4,
     "tensor_parallel_degree=3 does not divide the world size 4"),
    (ParallelismConfig(tp=TPConfig(tensor_parallel_degree=2)), 4, "add parallelism_config.fsdp"),
    (ParallelismConfig(fsdp=FSDPConfig(data_parallel_shard_degree=3)), 4,
     "data_parallel_shard_degree=3 does not match the world size 4"),
])
def test_degrees_that_do_not_fit_are_named(config: ParallelismConfig, world: int,
                                           match: str) -> None:
    with pytest.raises(ValueError, match=match):
        dims(config, world)


def test_degrees_must_multiply_to_the_world() -> None:
    with pytest.raises(ValueError, match=r"= 4 must equal the world size \(8\)"):
        ParallelDims(dp_replicate=1, dp_shard=2, tp=2, world_size=8)
    with pytest.raises(ValueError, match="tp must be at least 1"):
        ParallelDims(dp_replicate=1, dp_shard=1, tp=0, world_size=1)


def test_mesh_is_refused_when_nothing_shards() -> None:
    with pytest.raises(RuntimeError, match="needs no DeviceMesh"):
        dims(ParallelismConfig(), 2).build_mesh("cpu")
