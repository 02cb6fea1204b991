"""Composer's ``composer.devices``: the devices a model trains on.

:class:`DeviceCPU` and :class:`DeviceGPU` (CUDA) are what ``Trainer(device='cpu' | 'gpu' |
Device)`` takes; :func:`cadence.utils.device.get_device` turns a name into one. Names are
imported on first use (:mod:`cadence._lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cadence._lazy import lazy_exports

if TYPE_CHECKING:
    from cadence.devices.device import Device
    from cadence.devices.device_cpu import DeviceCPU
    from cadence.devices.device_gpu import DeviceGPU

__all__ = ["Device", "DeviceCPU", "DeviceGPU"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "Device": "cadence.devices.device",
    "DeviceCPU": "cadence.devices.device_cpu",
    "DeviceGPU": "cadence.devices.device_gpu",
})
