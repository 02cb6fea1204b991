"""Devices a model trains on: ``cadence.devices`` mirrors Composer's ``composer.devices``.

:class:`DeviceCPU` and :class:`DeviceGPU` (CUDA) are what ``Trainer(device='cpu' | 'gpu' |
Device)`` takes; :func:`get_device` turns a name into one.
"""

from __future__ import annotations

from cadence.devices.device import Device, DeviceCPU, DeviceGPU, get_device

__all__ = ["Device", "DeviceCPU", "DeviceGPU", "get_device"]
