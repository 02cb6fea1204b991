"""``local_tensor``: a DTensor's local shard (sharing its storage), a plain tensor as is."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as torch_dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from cadence.utils.dtensor import local_tensor


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
