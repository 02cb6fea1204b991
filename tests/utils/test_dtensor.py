"""``cadence.utils.dtensor``: a DTensor's local shard (sharing its storage) and the full
tensor, a shard back as a DTensor, a saved full tensor cut like a model's tensor, and the
layout's geometry; a plain tensor is handled as the single-process case throughout."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as torch_dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from cadence.utils.dtensor import (
    dtensor_like, full_tensor, is_shard_placement, local_tensor, replication_weight, shard_index,
    shard_like,
)


def test_plain_tensor_is_returned_unchanged() -> None:
    tensor = torch.arange(4.0)
    assert local_tensor(tensor) is tensor


def test_dtensor_gives_its_local_shard_sharing_storage(tmp_path: Path) -> None:
    store = torch_dist.FileStore(str(tmp_path / "store"), 1)
    torch_dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1,))
    full = torch.arange(6.0)
    sharded = distribute_tensor(full.clone(), mesh, [Shard(0)])
    assert isinstance(sharded, DTensor)
    local = local_tensor(sharded)
    assert not isinstance(local, DTensor)
    assert torch.equal(local, full)
    local.add_(1.0)  # writes the DTensor's shard in place
    assert torch.equal(sharded.full_tensor(), full + 1.0)


def test_plain_tensors_take_the_single_process_path() -> None:
    tensor = torch.arange(4.0)
    assert full_tensor(tensor) is tensor and dtensor_like(tensor, tensor) is tensor
    assert shard_index(tensor) == 0 and replication_weight(tensor) == 1.0
    copy = shard_like(torch.zeros(4, dtype=torch.float64), tensor)
    assert torch.equal(copy, tensor) and copy.dtype == torch.float32
    assert copy.data_ptr() != tensor.data_ptr()  # a copy, never the saved tensor itself
    assert shard_like(tensor, torch.ones(4), dtype=torch.bool).dtype == torch.bool
    with pytest.raises(ValueError, match=r"shape \(3,\) does not match the model's \(4,\)"):
        shard_like(tensor, torch.ones(3))


def test_placements_that_split() -> None:
    from torch.distributed.tensor.placement_types import _StridedShard

    assert is_shard_placement(Shard(0)) and not is_shard_placement(Replicate())
    assert is_shard_placement(_StridedShard(0, split_factor=2))  # FSDP2 over TP


@pytest.mark.world_size(2)
def test_two_ranks_shard_geometry_and_round_trips() -> None:
    rank = torch_dist.get_rank()
    mesh = init_device_mesh("cpu", (2,))
    full = torch.arange(8.0).reshape(4, 2)
    sharded = distribute_tensor(full.clone(), mesh, [Shard(0)])
    replicated = distribute_tensor(full.clone(), mesh, [Replicate()])
    # which shard, and how many ranks hold each entry
    assert shard_index(sharded) == rank and shard_index(replicated) == 0
    assert replication_weight(sharded) == 1.0 and replication_weight(replicated) == 0.5
    # the whole tensor on every rank
    assert torch.equal(full_tensor(sharded), full)
    # a local shard back as a DTensor of the same layout, sharing its storage
    local = local_tensor(sharded) * 10
    again = dtensor_like(sharded, local)
    assert isinstance(again, DTensor) and again.placements == sharded.placements
    assert again.shape == sharded.shape and local_tensor(again).data_ptr() == local.data_ptr()
    assert torch.equal(full_tensor(again), full * 10)
    # a saved full tensor cut into this rank's rows, no communication; a DTensor copied
    cut = shard_like(sharded, full + 1, dtype=torch.float64)
    assert isinstance(cut, DTensor) and cut.placements == sharded.placements
    assert cut.dtype == torch.float64
    assert torch.equal(local_tensor(cut), (full + 1)[2 * rank:2 * rank + 2].double())
    copied = shard_like(sharded, sharded)
    assert isinstance(copied, DTensor) and torch.equal(full_tensor(copied), full)
    assert local_tensor(copied).data_ptr() != local_tensor(sharded).data_ptr()
