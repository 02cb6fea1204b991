"""``unwrap_model``: the one helper that takes the user's model out of a DDP wrapper, used by
the parallel plan's init hooks, the checkpoint export, the optimizer monitor, the export
callback and ``export_for_inference``'s refusal of a wrapper."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
import torch
import torch.distributed as torch_dist
from torch import nn

import cadence.parallel
from cadence.callbacks.optimizer_monitor import _named_parameters
from cadence.checkpoint.export import huggingface_metadata
from cadence.parallel.param_init import init_hook
from cadence.utils import export_for_inference
from cadence.utils.misc import unwrap_model


class _WithInit(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(3, 2)

    def init_weights(self) -> None:
        nn.init.zeros_(self.layer.weight)


@pytest.fixture
def ddp(tmp_path: Path) -> Iterator[nn.parallel.DistributedDataParallel]:
    store = torch_dist.FileStore(str(tmp_path / "store"), 1)
    torch_dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield nn.parallel.DistributedDataParallel(_WithInit())


def test_a_plain_model_is_itself() -> None:
    model = nn.Linear(2, 2)
    assert unwrap_model(model) is model


def test_a_ddp_wrapper_gives_the_users_model(ddp: nn.parallel.DistributedDataParallel) -> None:
    inner = unwrap_model(ddp)
    assert inner is ddp.module and isinstance(inner, _WithInit)
    # every former copy now answers through it: the user's names, hooks and attributes
    assert [name for name, _ in _named_parameters(ddp)] == ["layer.weight", "layer.bias"]
    assert init_hook(ddp) == "init_weights"
    assert huggingface_metadata(ddp) == {}
    with pytest.raises(ValueError, match="not the wrapper"):
        export_for_inference(ddp, "torchscript", "unused.pt")


def test_the_public_parallel_name_is_the_one_helper() -> None:
    assert cadence.parallel.unwrap_model is unwrap_model
    from cadence.parallel import unwrap_model as imported

    assert imported is unwrap_model
    assert "unwrap_model" in cadence.parallel.__all__
