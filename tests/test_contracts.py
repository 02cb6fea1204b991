"""Contract tests over every registered algorithm, callback and logger destination:
each constructs with its defaults, survives a short fit with eval, and closes twice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from cadence import Trainer
from cadence.registry import algorithms, callbacks, loggers
from tests.algorithms.algorithm_helpers import SEQ, tiny_gpt, token_loader
from tests.algorithms.vision_helpers import image_loader, tiny_classifier
from tests.common.models import SimpleModel, make_dataloader

# Constructor arguments for components that need some; everything else uses its defaults.
REQUIRED_KWARGS: dict[str, dict[str, Any]] = {
    # SimpleModel's eval metric; patience 1ep cannot run out in a 2-epoch run, and accuracy
    # never exceeds 2, so neither stopper ends the run early.
    "early_stopper": {"monitor": "MulticlassAccuracy", "dataloader_label": "eval"},
    "threshold_stopper": {"monitor": "MulticlassAccuracy", "dataloader_label": "eval",
                          "threshold": 2.0},
    "alibi": {"max_sequence_length": 2 * SEQ},
    "stochastic_depth": {"target_layer_name": "ResNetBottleneck"},
    "ghost_batchnorm": {"ghost_batch_size": 4},
    "export_for_inference": {"save_format": "torchscript", "save_path": "model.pt"},
    "remote_uploader_downloader": {"bucket_uri": "file:///tmp/cadence-contract-bucket"},
}

# Components that act on one kind of model or data run on it: a tiny conv classifier on
# images, or a tiny GPT on tokens (with run-level settings such as the precision they need).
VISION = {"blurpool", "channels_last", "colout", "cutmix", "cutout", "factorize",
          "ghost_batchnorm", "mixup", "progressive_resizing", "squeeze_excite",
          "stochastic_depth", "weight_standardization", "gyro_dropout",
          "low_precision_groupnorm", "export_for_inference"}
LANGUAGE = {"alibi", "seq_length_warmup", "low_precision_layernorm"}
AMP = {"low_precision_groupnorm", "low_precision_layernorm"}

# Components whose fit needs what a generic run does not have; each has its own Trainer
# tests with the model or data it needs.
NEEDS_MORE = {
    "gated_linear_units": "rewrites BERT's FFN only (tests/algorithms/test_gated_linear_units.py)",
    "augmix": "inserts a PIL transform into the dataset (tests/algorithms/test_augmix.py)",
    "randaugment": "inserts a PIL transform into the dataset (tests/algorithms/test_randaugment.py)",
    "no_op_model": "replaces the model, so its metrics cannot be computed "
                   "(tests/algorithms/test_no_op_model.py)",
    "free_outputs": "frees the outputs the train metrics read, as Composer's does "
                    "(tests/callbacks/test_free_outputs.py)",
    "generate": "needs a model with a tokenizer (tests/callbacks/test_generate.py)",
    "load_checkpoint": "needs a checkpoint to load (tests/callbacks/test_load_checkpoint.py)",
}


def _skip_if_it_needs_more(name: str) -> None:
    if name in NEEDS_MORE:
        pytest.skip(f"{name} {NEEDS_MORE[name]}")


def _fit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str = "",
         **components: Any) -> Trainer:
    monkeypatch.chdir(tmp_path)
    if name in VISION:
        model: Any = tiny_classifier(num_blocks=1, groupnorm=name == "low_precision_groupnorm",
                                     dropout=0.1 if name == "gyro_dropout" else 0.0)
        train, evaluation = (image_loader(batch_size=8, num_samples=24),
                             image_loader(batch_size=8, num_samples=16, seed=1))
    elif name in LANGUAGE:
        model = tiny_gpt()
        train, evaluation = token_loader(num_samples=24), token_loader(num_samples=16, seed=1)
    else:
        model = SimpleModel()
        train = make_dataloader(num_batches=3)
        evaluation = make_dataloader(num_batches=2, seed=1)
    precision = "amp_bf16" if name in AMP else "fp32"
    trainer = Trainer(model=model, train_dataloader=train, eval_dataloader=evaluation,
                      max_duration="2ep", eval_interval="2ba", progress_bar=False, seed=0,
                      run_name="contract", log_interval="1ba", precision=precision,
                      **components)
    trainer.fit()
    return trainer


@pytest.mark.parametrize("name", algorithms.names())
def test_algorithm_contract(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _skip_if_it_needs_more(name)
    algorithm = algorithms.get(name)(**REQUIRED_KWARGS.get(name, {}))
    trainer = _fit(tmp_path, monkeypatch, name, algorithms=[algorithm])
    assert trainer.state.timestamp.batch == 6
    assert all(torch.isfinite(p).all() for p in trainer.state.model.parameters())
    trainer.close()
    trainer.close()
    algorithm.load_state_dict(algorithm.state_dict())


@pytest.mark.parametrize("name", callbacks.names())
@pytest.mark.filterwarnings("ignore:.*works on CUDA devices only:UserWarning")
def test_callback_contract(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _skip_if_it_needs_more(name)
    callback = callbacks.get(name)(**REQUIRED_KWARGS.get(name, {}))
    trainer = _fit(tmp_path, monkeypatch, name, callbacks=[callback])
    assert trainer.state.timestamp.batch == 6
    trainer.close()
    trainer.close()
    callback.load_state_dict(callback.state_dict())


@pytest.mark.parametrize("name", loggers.names())
def test_logger_contract(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    destination = loggers.get(name)(**REQUIRED_KWARGS.get(name, {}))
    trainer = _fit(tmp_path, monkeypatch, name, loggers=[destination])
    assert trainer.state.timestamp.batch == 6
    trainer.close()
    trainer.close()


def test_there_is_something_to_test() -> None:
    assert "gradient_clipping" in algorithms.names()
    assert len(callbacks.names()) >= 2 and len(loggers.names()) >= 3
