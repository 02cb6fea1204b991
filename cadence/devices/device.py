"""The :class:`Device` a run trains on: how modules, tensors, batches and optimizer state
get there, and which ``torch.distributed`` backend it uses.

Source: MosaicML Composer's ``Device``, ``DeviceCPU`` and ``DeviceGPU``
(``composer/devices/``) and ``composer.utils.get_device``: same names, attributes and
methods. Composer's TPU, MPS, HPU and Neuron devices are not provided.
"""

from __future__ import annotations

from abc import ABC
from typing import Any, Optional, TypeVar, Union

import torch

__all__ = ["Device", "DeviceCPU", "DeviceGPU", "get_device"]

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
        from cadence.trainer.microbatch import batch_to_device

        return batch_to_device(batch, self._device)

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


class DeviceCPU(Device):
    """The CPU; distributed runs use the ``gloo`` backend."""

    name = "cpu"
    dist_backend = "gloo"

    def __init__(self) -> None:
        self._device = torch.device("cpu")


class DeviceGPU(Device):
    """A CUDA GPU; distributed runs use the ``nccl`` backend.

    Args:
        device_id: the GPU index; default the process's local rank (``LOCAL_RANK``).
        allow_tf32: allow TF32 matmuls and convolutions (``torch.backends``); default True,
            as in Composer.

    Raises:
        ValueError: CUDA is not available.
    """

    name = "gpu"
    dist_backend = "nccl"

    def __init__(self, device_id: Optional[int] = None, *, allow_tf32: bool = True) -> None:
        if not torch.cuda.is_available():
            raise ValueError("DeviceGPU needs CUDA, which is not available here; use "
                             "device='cpu' (DeviceCPU).")
        if device_id is None:
            from cadence.trainer.dist import get_local_rank

            device_id = get_local_rank()
        self._device = torch.device("cuda", device_id)
        torch.cuda.set_device(self._device)
        torch.backends.cuda.matmul.allow_tf32 = allow_tf32
        torch.backends.cudnn.allow_tf32 = allow_tf32


_NAMES = {"cpu": DeviceCPU, "gpu": DeviceGPU, "cuda": DeviceGPU}


def get_device(device: Union[str, torch.device, Device, None] = None) -> Device:
    """A :class:`Device` from a name, a ``torch.device`` or a Device (returned as is).

    Args:
        device: ``"cpu"``, ``"gpu"`` (Composer's name) or ``"cuda"`` / ``"cuda:<id>"``, a
            ``torch.device``, a :class:`Device`, or ``None``: the GPU when CUDA is
            available, else the CPU.

    Raises:
        ValueError: an unknown name (the message lists the known ones), or a GPU asked for
            without CUDA.
    """
    if isinstance(device, Device):
        return device
    if device is None:
        return DeviceGPU() if torch.cuda.is_available() else DeviceCPU()
    if isinstance(device, str) and device.lower() in _NAMES:
        return _NAMES[device.lower()]()
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        resolved = None
    if resolved is not None and resolved.type == "cpu":
        return DeviceCPU()
    if resolved is not None and resolved.type == "cuda":
        return DeviceGPU(resolved.index)
    raise ValueError(f"device {device!r} is not supported; use 'cpu', 'gpu' (or 'cuda', "
                     f"'cuda:<index>'), a torch.device, a cadence.devices.Device, or None.")
