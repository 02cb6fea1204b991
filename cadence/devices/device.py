"""The :class:`Device` base class: how modules, tensors, batches and optimizer state get
to the device a run trains on, and which ``torch.distributed`` backend it uses.

Source: MosaicML Composer's ``Device`` (``composer/devices/device.py``): same attributes and
methods. The devices are :class:`~cadence.devices.device_cpu.DeviceCPU` and
:class:`~cadence.devices.device_gpu.DeviceGPU`; Composer's TPU, MPS, HPU and Neuron devices
are not provided. :func:`cadence.utils.device.get_device` turns a name into one.
"""

from __future__ import annotations

from abc import ABC
from typing import Any, TypeVar

import torch

from cadence.core.data_spec import batch_to_device as _batch_to_device

__all__ = ["Device"]

T_nnModule = TypeVar("T_nnModule", bound=torch.nn.Module)


class Device(ABC):
    """Base class of the devices a model runs on.

    Attributes:
        name: ``"cpu"`` or ``"gpu"`` (Composer's names).
        dist_backend: the ``torch.distributed`` backend for this device (``gloo``, ``nccl``).
    """

    name: str = ""
    dist_backend: str = ""
    _device: torch.device = torch.device("cpu")

    @property
    def torch_device(self) -> torch.device:
        """The ``torch.device`` tensors are moved to (``cpu``, ``cuda:<id>``)."""
        return self._device

    def module_to_device(self, module: T_nnModule) -> T_nnModule:
        """Move ``module``'s parameters and buffers to the device (in place); returns it."""
        return module.to(self._device)

    def tensor_to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` on the device (non-blocking)."""
        return tensor.to(self._device, non_blocking=True)

    def batch_to_device(self, batch: Any) -> Any:
        """``batch`` with every tensor moved to the device: tensors, mappings (a tokenizer's
        ``BatchEncoding`` included), lists, tuples and named tuples, nested; other values
        are kept as they are. Same traversal as the Trainer's own batch transfer."""
        return _batch_to_device(batch, self._device)


    def optimizer_to_device(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Move the tensors of ``optimizer``'s state (moments, steps) to the device."""
        for state in optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    state[key] = self.tensor_to_device(value)
        return optimizer

    def state_dict(self) -> dict[str, Any]:
        """The device's own state for a checkpoint (none here; RNG states are saved by the
        checkpoint itself)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (nothing to restore here)."""
        del state

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._device})"
