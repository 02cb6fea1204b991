"""cadence.devices: Composer's Device API (name, dist_backend, *_to_device) and
Trainer(device=...)."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch

from cadence import Trainer
from cadence.devices import Device, DeviceCPU, DeviceGPU
from cadence.utils.device import get_device
from tests.common.models import SimpleModel, make_dataloader


def test_cpu_device_attributes() -> None:
    device = DeviceCPU()
    assert isinstance(device, Device)
    assert device.name == "cpu" and device.dist_backend == "gloo"
    assert device.torch_device == torch.device("cpu")
    assert DeviceGPU.name == "gpu" and DeviceGPU.dist_backend == "nccl"


def test_moves_tensors_modules_batches_and_optimizer_state() -> None:
    device = DeviceCPU()
    module = torch.nn.Linear(2, 2)
    assert device.module_to_device(module) is module
    assert device.tensor_to_device(torch.ones(2)).device.type == "cpu"
    Pair = namedtuple("Pair", "x y")
    batch = {"a": torch.ones(1), "b": [torch.zeros(1), "text"], "c": Pair(torch.ones(1), 3)}
    moved = device.batch_to_device(batch)
    assert isinstance(moved["c"], Pair) and moved["c"].y == 3 and moved["b"][1] == "text"
    assert torch.equal(moved["a"], torch.ones(1))
    opt = torch.optim.Adam(module.parameters())
    module(torch.ones(1, 2)).sum().backward()
    opt.step()
    assert device.optimizer_to_device(opt) is opt
    assert all(v.device.type == "cpu" for s in opt.state.values() for v in s.values())
    assert device.state_dict() == {}


def test_get_device_names() -> None:
    assert isinstance(get_device("cpu"), DeviceCPU)
    assert isinstance(get_device(torch.device("cpu")), DeviceCPU)
    cpu = DeviceCPU()
    assert get_device(cpu) is cpu
    with pytest.raises(ValueError, match="not supported"):
        get_device("tpu")
    if not torch.cuda.is_available():
        assert isinstance(get_device(None), DeviceCPU)
        with pytest.raises(ValueError, match="CUDA"):
            get_device("gpu")
        with pytest.raises(ValueError, match="CUDA"):
            DeviceGPU()


@pytest.mark.parametrize("device", ["cpu", DeviceCPU(), torch.device("cpu")])
def test_trainer_takes_names_and_devices(device: object) -> None:
    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=1),
                      max_duration="1ba", device=device, progress_bar=False, seed=0)
    trainer.fit()
    trainer.close()
    assert trainer.state.device == torch.device("cpu")
    assert all(p.device.type == "cpu" for p in trainer.state.model.parameters())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without a GPU")
def test_trainer_gpu_without_cuda_says_so() -> None:
    with pytest.raises(ValueError, match="CUDA"):
        Trainer(model=SimpleModel(), device="gpu", progress_bar=False)
