"""Callbacks: observe a run and log, one module each, imported on first use. The registry
imports them on its first look-up (:data:`_REGISTERING_MODULES`), which registers them in
:data:`cadence.registry.registry.callbacks`: ``lr_monitor``, ``speed_monitor``,
``memory_monitor``, ``optimizer_monitor``, ``nan_monitor``, ``early_stopper``,
``threshold_stopper``, ``runtime_estimator``, ``profiler``, ``load_checkpoint``,
``free_outputs``, ``memory_snapshot``, ``oom_observer``, ``activation_monitor``,
``system_metrics_monitor``, ``export_for_inference``, ``expert_load_monitor``. Composer's ``MLPerfCallback`` is left
out (see README's "Coming from Composer").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cadence._lazy import lazy_exports

if TYPE_CHECKING:
    from cadence.callbacks.activation_monitor import ActivationMonitor
    from cadence.callbacks.checkpoint_saver import CheckpointSaver
    from cadence.callbacks.early_stopper import EarlyStopper
    from cadence.callbacks.expert_load_monitor import ExpertLoadMonitor
    from cadence.callbacks.export_for_inference import ExportForInferenceCallback
    from cadence.callbacks.free_outputs import FreeOutputs
    from cadence.callbacks.load_checkpoint import LoadCheckpoint
    from cadence.callbacks.lr_monitor import LRMonitor
    from cadence.callbacks.memory_monitor import MemoryMonitor
    from cadence.callbacks.memory_snapshot import MemorySnapshot
    from cadence.callbacks.nan_monitor import NaNMonitor
    from cadence.callbacks.oom_observer import OOMObserver
    from cadence.callbacks.optimizer_monitor import OptimizerMonitor
    from cadence.callbacks.profiler import ProfilerCallback
    from cadence.callbacks.runtime_estimator import RuntimeEstimator
    from cadence.callbacks.speed_monitor import SpeedMonitor
    from cadence.callbacks.system_metrics_monitor import SystemMetricsMonitor
    from cadence.callbacks.threshold_stopper import ThresholdStopper

_LAZY = {
    # CheckpointSaver (Composer's ``composer.callbacks.CheckpointSaver``) is not registered by
    # name: the Trainer adds it from its save_* arguments.
    "CheckpointSaver": "cadence.callbacks.checkpoint_saver",
    "EarlyStopper": "cadence.callbacks.early_stopper",
    "Generate": "cadence.callbacks.generate",
    "ImageVisualizer": "cadence.callbacks.image_visualizer",
    "ThresholdStopper": "cadence.callbacks.threshold_stopper",
    "LRMonitor": "cadence.callbacks.lr_monitor",
    "MemoryMonitor": "cadence.callbacks.memory_monitor",
    "NaNMonitor": "cadence.callbacks.nan_monitor",
    "OptimizerMonitor": "cadence.callbacks.optimizer_monitor",
    "ProfilerCallback": "cadence.callbacks.profiler",
    "RuntimeEstimator": "cadence.callbacks.runtime_estimator",
    "SpeedMonitor": "cadence.callbacks.speed_monitor",
    "ActivationMonitor": "cadence.callbacks.activation_monitor",
    "ExportForInferenceCallback": "cadence.callbacks.export_for_inference",
    "ExpertLoadMonitor": "cadence.callbacks.expert_load_monitor",
    "FreeOutputs": "cadence.callbacks.free_outputs",
    "LoadCheckpoint": "cadence.callbacks.load_checkpoint",
    "MemorySnapshot": "cadence.callbacks.memory_snapshot",
    "OOMObserver": "cadence.callbacks.oom_observer",
    "SystemMetricsMonitor": "cadence.callbacks.system_metrics_monitor",
}

__all__ = sorted(_LAZY)

#: The modules whose import registers the callbacks in :data:`cadence.registry.registry.callbacks`
#: (the registry imports them on its first look-up).
# CheckpointSaver is not a run-file name: the Trainer adds it from its save_* arguments.
_REGISTERING_MODULES = tuple(sorted(set(_LAZY.values()) - {"cadence.callbacks.checkpoint_saver"}))

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
