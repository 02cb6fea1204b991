"""Composer's public import paths resolve in cadence (a port is ``s/composer/cadence/``), and
each name is the one object that lives in its own module."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

PATHS = {
    "cadence.core": ["Time", "TimeUnit", "Timestamp", "State", "Event", "Engine", "Algorithm",
                     "Callback", "Evaluator", "Precision", "passes", "ensure_time", "Trace"],
    "cadence.core.time": ["Time", "TimeUnit", "Timestamp", "ensure_time"],
    "cadence.core.passes": ["sort_to_front", "sort_to_back", "AlgorithmPass"],
    "cadence.core.state": ["State"],
    "cadence.core.event": ["Event"],
    "cadence.core.engine": ["Engine", "Trace", "Traces"],
    "cadence.loggers": ["Logger", "LoggerDestination", "ConsoleLogger", "FileLogger",
                        "InMemoryLogger", "ProgressBarLogger", "WandBLogger"],
    "cadence.optim": ["ComposerScheduler", "compile_composer_scheduler", "StepScheduler",
                      "MultiStepScheduler", "ConstantScheduler", "LinearScheduler",
                      "ExponentialScheduler", "CosineAnnealingScheduler",
                      "CosineAnnealingWarmRestartsScheduler", "PolynomialScheduler",
                      "ConstantWithWarmupScheduler", "LinearWithWarmupScheduler",
                      "CosineAnnealingWithWarmupScheduler", "PolynomialWithWarmupScheduler",
                      "MultiStepWithWarmupScheduler", "DecoupledAdamW", "DecoupledSGDW"],
    "cadence.utils.dist": ["get_world_size", "get_global_rank", "get_local_rank", "barrier",
                           "all_reduce", "broadcast", "get_sampler"],
    "cadence.dist": ["get_world_size", "get_global_rank"],
    "cadence.devices": ["DeviceCPU", "DeviceGPU"],
    "cadence.metrics": ["LanguageCrossEntropy", "LanguagePerplexity", "CrossEntropy",
                        "LossMetric", "MaskedAccuracy"],
    "cadence.callbacks": ["SpeedMonitor", "LRMonitor", "MemoryMonitor", "CheckpointSaver"],
    "cadence.algorithms": ["GradientClipping", "EMA"],
    "cadence.models": ["ComposerModel", "HuggingFaceModel", "ComposerClassifier"],
    "cadence.trainer": ["Trainer"],
}


@pytest.mark.parametrize("module", sorted(PATHS))
def test_composer_paths_resolve(module: str) -> None:
    mod = importlib.import_module(module)
    missing = [name for name in PATHS[module] if not hasattr(mod, name)]
    assert not missing, f"{module} lacks {missing}"
    exported = getattr(mod, "__all__", None)
    if exported is not None and not module.startswith("cadence.core."):
        assert not [n for n in PATHS[module] if n not in exported], f"{module}.__all__"


def test_one_object_per_concept() -> None:
    import cadence
    from cadence import core, optim
    from cadence.trainer.core import state, time
    from cadence.trainer.schedulers import CosineAnnealingScheduler
    from cadence.utils import dist as utils_dist

    assert core.Time is time.Time is cadence.Time and core.State is state.State
    assert core.passes is importlib.import_module("cadence.core.passes")
    assert optim.CosineAnnealingScheduler is CosineAnnealingScheduler
    assert utils_dist.get_world_size is cadence.dist.get_world_size


def test_composer_style_imports_in_a_fresh_interpreter() -> None:
    code = (
        "from cadence.trainer import Trainer\n"
        "from cadence.core import Time, TimeUnit, State, Event, Precision, passes\n"
        "from cadence.core.time import Timestamp\n"
        "from cadence.core.passes import sort_to_front\n"
        "from cadence.utils import dist\n"
        "from cadence.optim import CosineAnnealingWithWarmupScheduler, DecoupledAdamW\n"
        "from cadence.loggers import InMemoryLogger\n"
        "print(Trainer.__module__, dist.get_world_size())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.strip() == "cadence.trainer.trainer 1"
