"""``fsdp: {sync_module_states: true}``: ranks that built different weights all train rank 0's,
under FSDP2 alone and under FSDP2 x tensor parallelism (where each rank must keep its own
slice of rank 0's weights, not rank 0's slice)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from cadence import Trainer, dist
from tests.common.models import SimpleModel


class TPModel(SimpleModel):
    """SimpleModel with a tensor-parallel plan (``net.0`` colwise, ``net.2`` rowwise)."""

    def tp_plan(self) -> dict[str, str]:
        return {"net.0": "colwise", "net.2": "rowwise"}


def check_rank0_weights_everywhere(parallelism_config: dict[str, Any]) -> None:
    torch.manual_seed(100 + dist.get_global_rank())  # every rank its own weights
    model = TPModel()
    rank0 = [{k: v.clone() for k, v in model.state_dict().items()}]
    dist.broadcast_object_list(rank0, src=0)
    if dist.get_global_rank() != 0:
        assert not torch.equal(model.state_dict()["net.0.weight"], rank0[0]["net.0.weight"])
    data = TensorDataset(torch.randn(8, 8), torch.randint(0, 3, (8,)))
    loader = DataLoader(data, batch_size=2, sampler=dist.get_sampler(data))
    trainer = Trainer(model=model, train_dataloader=loader, max_duration="1ba",
                      progress_bar=False, device="cpu", parallelism_config=parallelism_config)
    for name, value in trainer.state.model.state_dict().items():
        full = value.full_tensor() if hasattr(value, "full_tensor") else value
        assert torch.equal(full, rank0[0][name]), name
    trainer.close()


@pytest.mark.world_size(2)
def test_fsdp_sync_module_states_gives_every_rank_rank0s_weights() -> None:
    check_rank0_weights_everywhere({"fsdp": {"sync_module_states": True}})


@pytest.mark.world_size(2)
def test_fsdp_x_tp_sync_module_states_keeps_each_ranks_slice_of_rank0s_weights() -> None:
    check_rank0_weights_everywhere({"fsdp": {"sync_module_states": True},
                                    "tp": {"tensor_parallel_degree": 2}})
