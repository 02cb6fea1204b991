"""Callbacks: observe a run and log, one module each. Importing this package registers them
in :data:`cadence.trainer.registry.callbacks`: ``lr_monitor``, ``speed_monitor``,
``memory_monitor``, ``optimizer_monitor``, ``nan_monitor``, ``early_stopper``,
``threshold_stopper``, ``runtime_estimator``.
"""

from __future__ import annotations

from cadence.callbacks.early_stopper import EarlyStopper, ThresholdStopper
from cadence.callbacks.lr_monitor import LRMonitor
from cadence.callbacks.memory_monitor import MemoryMonitor
from cadence.callbacks.nan_monitor import NaNMonitor
from cadence.callbacks.optimizer_monitor import OptimizerMonitor
from cadence.callbacks.runtime_estimator import RuntimeEstimator
from cadence.callbacks.speed_monitor import SpeedMonitor

__all__ = [
    "EarlyStopper", "LRMonitor", "MemoryMonitor", "NaNMonitor", "OptimizerMonitor",
    "RuntimeEstimator", "SpeedMonitor", "ThresholdStopper",
]
