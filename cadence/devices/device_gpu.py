"""A CUDA GPU as a :class:`~cadence.devices.device.Device` (Composer's
``composer/devices/device_gpu.py``)."""

from __future__ import annotations

from typing import Optional

import torch

from cadence.devices.device import Device
from cadence.utils.dist import get_local_rank

__all__ = ["DeviceGPU"]


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
            device_id = get_local_rank()
        self._device = torch.device("cuda", device_id)
        torch.cuda.set_device(self._device)
        torch.backends.cuda.matmul.allow_tf32 = allow_tf32
        torch.backends.cudnn.allow_tf32 = allow_tf32
