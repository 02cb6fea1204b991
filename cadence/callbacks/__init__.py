"""Callbacks: observe a run and log, one module each. Importing this package registers them
(``lr_monitor``, ``speed_monitor``) in :data:`cadence.trainer.registry.callbacks`.
"""

from __future__ import annotations

from cadence.callbacks.lr_monitor import LRMonitor
from cadence.callbacks.speed_monitor import SpeedMonitor

__all__ = ["LRMonitor", "SpeedMonitor"]
