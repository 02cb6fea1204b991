"""Composer's import paths are cadence's real modules (a port is ``s/composer/cadence/``):
each path below is the module that *defines* the names listed under it, every package is
reachable from ``import cadence`` as an attribute, and no alias module or ``sys.modules``
patching is left in the package."""

from __future__ import annotations

import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "cadence"

#: Composer 0.32.1 module path (with ``composer`` renamed) -> names defined there.
DEFINED_IN = {
    "cadence.core.time": ["Time", "TimeUnit", "Timestamp", "ensure_time"],
    "cadence.core.state": ["State"],
    "cadence.core.event": ["Event"],
    "cadence.core.engine": ["Engine", "Trace"],
    "cadence.core.algorithm": ["Algorithm"],
    "cadence.core.callback": ["Callback"],
    "cadence.core.passes": ["sort_to_front", "sort_to_back"],
    "cadence.core.evaluator": ["Evaluator"],
    "cadence.core.precision": ["Precision", "get_precision_context"],
    "cadence.core.data_spec": ["split_batch", "num_samples"],
    "cadence.core.types": ["MemoryFormat", "TrainerMode"],
    "cadence.optim.scheduler": [
        "ComposerScheduler", "compile_composer_scheduler", "StepScheduler",
        "MultiStepScheduler", "ConstantScheduler", "LinearScheduler", "ExponentialScheduler",
        "CosineAnnealingScheduler", "CosineAnnealingWarmRestartsScheduler",
        "PolynomialScheduler", "ConstantWithWarmupScheduler", "LinearWithWarmupScheduler",
        "CosineAnnealingWithWarmupScheduler", "PolynomialWithWarmupScheduler",
        "MultiStepWithWarmupScheduler"],
    "cadence.optim.decoupled_weight_decay": ["DecoupledAdamW", "DecoupledSGDW"],
    "cadence.loggers.logger": ["Logger"],
    "cadence.loggers.logger_destination": ["LoggerDestination"],
    "cadence.loggers.console_logger": ["ConsoleLogger"],
    "cadence.loggers.progress_bar_logger": ["ProgressBarLogger"],
    "cadence.loggers.file_logger": ["FileLogger"],
    "cadence.loggers.in_memory_logger": ["InMemoryLogger"],
    "cadence.loggers.wandb_logger": ["WandBLogger"],
    "cadence.loggers.tensorboard_logger": ["TensorboardLogger"],
    "cadence.loggers.mlflow_logger": ["MLFlowLogger"],
    "cadence.callbacks.checkpoint_saver": ["CheckpointSaver"],
    "cadence.callbacks.early_stopper": ["EarlyStopper"],
    "cadence.callbacks.threshold_stopper": ["ThresholdStopper"],
    "cadence.callbacks.lr_monitor": ["LRMonitor"],
    "cadence.callbacks.memory_monitor": ["MemoryMonitor"],
    "cadence.callbacks.nan_monitor": ["NaNMonitor"],
    "cadence.callbacks.optimizer_monitor": ["OptimizerMonitor"],
    "cadence.callbacks.runtime_estimator": ["RuntimeEstimator"],
    "cadence.callbacks.speed_monitor": ["SpeedMonitor"],
    "cadence.models.base": ["ComposerModel"],
    "cadence.models.huggingface": ["HuggingFaceModel"],
    "cadence.models.tasks.classification": ["ComposerClassifier"],
    "cadence.metrics.nlp": ["LanguageCrossEntropy", "LanguagePerplexity", "MaskedAccuracy"],
    "cadence.metrics.metrics": ["CrossEntropy", "LossMetric"],
    "cadence.loss.loss": ["soft_cross_entropy"],
    "cadence.utils.dist": ["get_world_size", "get_global_rank", "get_local_rank", "barrier",
                           "all_reduce", "broadcast", "get_sampler"],
    "cadence.utils.reproducibility": ["seed_all"],
    "cadence.utils.misc": ["create_interval_scheduler"],
    "cadence.utils.batch_helpers": ["batch_get", "batch_set"],
    "cadence.utils.device": ["get_device"],
    "cadence.devices.device": ["Device"],
    "cadence.devices.device_cpu": ["DeviceCPU"],
    "cadence.devices.device_gpu": ["DeviceGPU"],
    # Composer's algorithm packages: composer/algorithms/<name>/<name>.py and helpers
    "cadence.algorithms.alibi.alibi": ['Alibi', 'apply_alibi'],
    "cadence.algorithms.augmix.augmix": ['AugMix', 'AugmentAndMixTransform', 'augmix_image'],
    "cadence.algorithms.blurpool.blurpool": ['BlurPool', 'apply_blurpool'],
    "cadence.algorithms.channels_last.channels_last": ['ChannelsLast', 'apply_channels_last'],
    "cadence.algorithms.colout.colout": ['ColOut', 'ColOutTransform', 'colout_batch'],
    "cadence.algorithms.cutmix.cutmix": ['CutMix', 'cutmix_batch'],
    "cadence.algorithms.cutout.cutout": ['CutOut', 'cutout_batch'],
    "cadence.algorithms.ema.ema": ['EMA', 'compute_ema'],
    "cadence.algorithms.factorize.factorize": ['Factorize', 'apply_factorization'],
    "cadence.algorithms.factorize.factorize_modules": ['FactorizedConv2d', 'FactorizedLinear', 'factorizing_could_speedup'],
    "cadence.algorithms.gated_linear_units.gated_linear_units": ['GatedLinearUnits', 'apply_gated_linear_units'],
    "cadence.algorithms.ghost_batchnorm.ghost_batchnorm": ['GhostBatchNorm', 'GhostBatchNorm1d', 'GhostBatchNorm2d', 'GhostBatchNorm3d', 'apply_ghost_batchnorm'],
    "cadence.algorithms.gradient_clipping.gradient_clipping": ['GradientClipping', 'apply_gradient_clipping'],
    "cadence.algorithms.gyro_dropout.gyro_dropout": ['GyroDropout', 'GyroDropoutLayer', 'apply_gyro_dropout'],
    "cadence.algorithms.label_smoothing.label_smoothing": ['LabelSmoothing', 'smooth_labels'],
    "cadence.algorithms.layer_freezing.layer_freezing": ['LayerFreezing', 'freeze_layers'],
    "cadence.algorithms.low_precision_groupnorm.low_precision_groupnorm": ['LPGroupNorm', 'LowPrecisionGroupNorm', 'apply_low_precision_groupnorm'],
    "cadence.algorithms.low_precision_layernorm.low_precision_layernorm": ['LPLayerNorm', 'LowPrecisionLayerNorm', 'apply_low_precision_layernorm'],
    "cadence.algorithms.mixup.mixup": ['MixUp', 'mixup_batch'],
    "cadence.algorithms.no_op_model.no_op_model": ['NoOpModel', 'NoOpModelClass'],
    "cadence.algorithms.progressive_resizing.progressive_resizing": ['ProgressiveResizing', 'resize_batch'],
    "cadence.algorithms.randaugment.randaugment": ['RandAugment', 'RandAugmentTransform', 'randaugment_image'],
    "cadence.algorithms.sam.sam": ['SAM', 'SAMOptimizer'],
    "cadence.algorithms.selective_backprop.selective_backprop": ['SelectiveBackprop', 'select_using_loss', 'should_selective_backprop'],
    "cadence.algorithms.seq_length_warmup.seq_length_warmup": ['SeqLengthWarmup', 'set_batch_sequence_length'],
    "cadence.algorithms.squeeze_excite.squeeze_excite": ['SqueezeExcite', 'SqueezeExcite2d', 'SqueezeExciteConv2d', 'apply_squeeze_excite'],
    "cadence.algorithms.stochastic_depth.stochastic_depth": ['StochasticDepth', 'apply_stochastic_depth'],
    "cadence.algorithms.swa.swa": ['SWA'],
    "cadence.algorithms.utils.augmentation_common": ['image_as_type', 'map_pillow_function'],
    "cadence.algorithms.utils.augmentation_primitives": ['autocontrast', 'brightness', 'brightness_original', 'color', 'color_original', 'contrast', 'contrast_original', 'equalize', 'posterize', 'rotate', 'sharpness', 'sharpness_original', 'shear_x', 'shear_y', 'solarize', 'translate_x', 'translate_y'],
    "cadence.algorithms.warnings": ['NoEffectWarning'],
    "cadence.algorithms.weight_standardization.weight_standardization": ['WeightStandardization', 'WeightStandardizer', 'apply_weight_standardization'],
    "cadence.algorithms.blurpool.blurpool_layers": ["BlurConv2d", "BlurMaxPool2d", "BlurPool2d",
                                                   "blur_2d", "blurmax_pool2d"],
    "cadence.algorithms.factorize.factorize_core": ["LowRankSolution", "factorize_conv2d",
                                                   "factorize_matrix"],
    "cadence.algorithms.gated_linear_units.gated_linear_unit_layers": ["BERTGatedFFOutput"],
    "cadence.trainer.trainer": ["Trainer"],
}

#: Package -> names it re-exports (Composer's package-level imports).
PACKAGE_EXPORTS = {
    "cadence.core": ["Time", "TimeUnit", "Timestamp", "State", "Event", "Engine", "Algorithm",
                     "Callback", "Evaluator", "Precision", "get_precision_context", "passes",
                     "ensure_time", "Trace", "Batch", "JSON", "MemoryFormat", "TrainerMode",
                     "PyTorchScheduler"],
    "cadence.loggers": ["Logger", "LoggerDestination", "ConsoleLogger", "FileLogger",
                        "InMemoryLogger", "ProgressBarLogger", "WandBLogger",
                        "TensorboardLogger", "MLFlowLogger"],
    "cadence.optim": DEFINED_IN["cadence.optim.scheduler"] + ["DecoupledAdamW", "DecoupledSGDW"],
    "cadence.callbacks": ["SpeedMonitor", "LRMonitor", "MemoryMonitor", "CheckpointSaver",
                          "EarlyStopper", "ThresholdStopper", "NaNMonitor", "OptimizerMonitor",
                          "RuntimeEstimator"],
    "cadence.models": ["ComposerModel", "HuggingFaceModel", "ComposerClassifier"],
    "cadence.models.tasks": ["ComposerClassifier"],
    "cadence.metrics": ["LanguageCrossEntropy", "LanguagePerplexity", "CrossEntropy",
                        "LossMetric", "MaskedAccuracy"],
    "cadence.devices": ["Device", "DeviceCPU", "DeviceGPU"],
    "cadence.utils": ["dist", "reproducibility", "create_interval_scheduler", "batch_get",
                      "batch_set", "get_device", "seed_all"],
    "cadence.trainer": ["Trainer"],
    "cadence.dist": ["get_world_size", "get_global_rank"],
}


@pytest.mark.parametrize("module", sorted(DEFINED_IN))
def test_each_composer_path_defines_its_names(module: str) -> None:
    mod = importlib.import_module(module)
    wrong = {name: getattr(getattr(mod, name, None), "__module__", "missing")
             for name in DEFINED_IN[module]}
    wrong = {name: where for name, where in wrong.items() if where != module}
    assert not wrong, f"{module}: these names are defined elsewhere: {wrong}"
    assert set(DEFINED_IN[module]) <= set(mod.__all__), f"{module}.__all__"


@pytest.mark.parametrize("package", sorted(PACKAGE_EXPORTS))
def test_packages_export_composers_names(package: str) -> None:
    mod = importlib.import_module(package)
    missing = [name for name in PACKAGE_EXPORTS[package] if not hasattr(mod, name)]
    assert not missing, f"{package} lacks {missing}"
    assert set(PACKAGE_EXPORTS[package]) <= set(mod.__all__), f"{package}.__all__"


def test_package_exports_are_the_defining_objects() -> None:
    for package, names in PACKAGE_EXPORTS.items():
        mod = importlib.import_module(package)
        for name in names:
            obj = getattr(mod, name)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)) or \
                    not obj.__module__.startswith("cadence."):
                continue  # modules and type aliases (Batch = Any) have no defining module
            defining = importlib.import_module(obj.__module__)
            assert getattr(defining, name) is obj, f"{package}.{name}"


def test_subpackages_are_attributes_of_cadence_in_a_fresh_interpreter() -> None:
    code = (
        "import sys, cadence\n"
        "assert 'torch' not in sys.modules\n"
        "print(cadence.optim.DecoupledAdamW.__module__, cadence.trainer.Trainer.__module__,\n"
        "      cadence.core.Time.__module__, cadence.utils.dist.get_world_size(),\n"
        "      cadence.models.tasks.ComposerClassifier.__module__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out == ["cadence.optim.decoupled_weight_decay", "cadence.trainer.trainer",
                   "cadence.core.time", "1", "cadence.models.tasks.classification"]


def test_every_subpackage_is_reachable_and_listed() -> None:
    import cadence

    on_disk = {p.parent.name for p in PACKAGE.glob("*/__init__.py")} | {"dist"}
    assert on_disk == set(cadence.SUBPACKAGES)
    for name in cadence.SUBPACKAGES:
        assert inspect.ismodule(getattr(cadence, name)), name


def test_no_alias_modules_or_sys_modules_patching() -> None:
    # An alias module re-exports another module wholesale (``from x import *``); the one
    # allowed is ``cadence.dist``, the README's short name for ``cadence.utils.dist``.
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        relative = path.relative_to(PACKAGE.parent).as_posix()
        if "import *" in text and relative != "cadence/dist.py":
            offenders.append(f"{relative}: star import")
        if re.search(r"sys\.modules\[[^\]]+\]\s*=|sys\.modules\.setdefault", text):
            offenders.append(f"{relative}: writes sys.modules")
    assert offenders == []
    from cadence import dist
    from cadence.utils import dist as utils_dist

    assert dist.__all__ == utils_dist.__all__
    assert all(getattr(dist, n) is getattr(utils_dist, n) for n in dist.__all__)


def test_composer_style_imports_in_a_fresh_interpreter() -> None:
    code = (
        "from cadence.trainer import Trainer\n"
        "from cadence.core import Time, TimeUnit, State, Event, Precision, passes\n"
        "from cadence.core.time import Timestamp\n"
        "from cadence.core.passes import sort_to_front\n"
        "from cadence.utils import dist\n"
        "from cadence.optim import CosineAnnealingWithWarmupScheduler, DecoupledAdamW\n"
        "from cadence.optim.scheduler import LinearWithWarmupScheduler\n"
        "from cadence.loggers import InMemoryLogger\n"
        "from cadence.loggers.logger_destination import LoggerDestination\n"
        "from cadence.models.tasks import ComposerClassifier\n"
        "from cadence.metrics.nlp import LanguageCrossEntropy\n"
        "print(Trainer.__module__, dist.get_world_size())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.strip() == "cadence.trainer.trainer 1"
