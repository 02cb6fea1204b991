"""The CPU as a :class:`~cadence.devices.device.Device` (Composer's
``composer/devices/device_cpu.py``)."""

from __future__ import annotations

import torch

from cadence.devices.device import Device

__all__ = ["DeviceCPU"]


class DeviceCPU(Device):
    """The CPU; distributed runs use the ``gloo`` backend."""

    name = "cpu"
    dist_backend = "gloo"

    def __init__(self) -> None:
        self._device = torch.device("cpu")
