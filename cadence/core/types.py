"""Type aliases and small enums used across a run's annotations.

Source: MosaicML Composer's ``composer/core/types.py`` (same names and meanings).
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Union

import torch

__all__ = ["JSON", "Batch", "Dataset", "MemoryFormat", "PyTorchScheduler", "TrainerMode"]

#: A batch as the dataloader yields it: a tensor, a mapping of tensors, a list or tuple of
#: tensors (nested), sample dimension first. See :mod:`cadence.core.data_spec`.
Batch = Any

#: Values that ``json.dumps`` takes as they are.
JSON = Union[str, float, int, None, list["JSON"], dict[str, "JSON"]]

#: A torch learning-rate scheduler.
PyTorchScheduler = torch.optim.lr_scheduler.LRScheduler

#: A dataset of batches (``torch.utils.data.Dataset``), as Composer names it.
Dataset = torch.utils.data.Dataset


class MemoryFormat(str, Enum):
    """A tensor's memory layout, as ``torch.<value>`` names it (``torch.channels_last``)."""

    CONTIGUOUS_FORMAT = "contiguous_format"
    CHANNELS_LAST = "channels_last"
    CHANNELS_LAST_3D = "channels_last_3d"
    PRESERVE_FORMAT = "preserve_format"


class TrainerMode(str, Enum):
    """What the Trainer is doing: training, evaluating or predicting."""

    TRAIN = "train"
    EVAL = "eval"
    PREDICT = "predict"
