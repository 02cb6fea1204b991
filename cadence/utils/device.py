"""Turn a device name into a :class:`~cadence.devices.device.Device`.

Source: MosaicML Composer's ``composer.utils.get_device`` (``composer/utils/device.py``).
"""

from __future__ import annotations

from typing import Union

import torch

from cadence.devices.device import Device
from cadence.devices.device_cpu import DeviceCPU
from cadence.devices.device_gpu import DeviceGPU

__all__ = ["get_device"]

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
