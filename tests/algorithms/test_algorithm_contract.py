"""The contract every registered algorithm keeps (as Composer's algorithm_settings tests
check each of its algorithms): it is an :class:`~cadence.Algorithm` that constructs with its
defaults (plus :data:`REQUIRED_KWARGS`); its ``state_dict()`` is plain data a checkpoint
reads back (``torch.load(weights_only=True)``) and survives ``load_state_dict`` into a fresh
instance; it declares ``events``, and ``match`` is False on every event outside them."""

from __future__ import annotations

import inspect
import io
import warnings
from typing import Any

import pytest
import torch

from cadence import Algorithm, Event, State
from cadence.registry import algorithms
from cadence.core import Time, Timestamp
from tests.common.models import SimpleModel, make_dataloader

#: registry name -> the smallest arguments for the algorithm's required parameters. An
#: algorithm with a required parameter must be listed here (the test says so).
REQUIRED_KWARGS: dict[str, dict[str, Any]] = {
    "alibi": {"max_sequence_length": 16},
    "stochastic_depth": {"target_layer_name": "ResNetBottleneck"},
}

#: Composer 0.32.1's algorithms (``composer.algorithms``) by module name, and cadence's own:
#: each must be registered (a placeholder module registers nothing).
EXPECTED = sorted({
    "alibi", "augmix", "blurpool", "channels_last", "colout", "cutmix", "cutout", "ema",
    "factorize", "gated_linear_units", "ghost_batchnorm", "gradient_clipping", "gyro_dropout",
    "label_smoothing", "layer_freezing", "low_precision_groupnorm", "low_precision_layernorm",
    "mixup", "no_op_model", "progressive_resizing", "randaugment", "sam", "selective_backprop",
    "seq_length_warmup", "squeeze_excite", "stochastic_depth", "swa", "weight_standardization",
    "activation_checkpointing", "child_tuning", "mixed_precision",
})

NAMES = algorithms.names()


def test_every_algorithm_is_registered() -> None:
    missing = sorted(set(EXPECTED) - set(NAMES))
    assert not missing, f"not registered (still a placeholder?): {missing}"


def _required(factory: Any) -> list[str]:
    return [p.name for p in inspect.signature(factory).parameters.values()
            if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _build(name: str) -> Algorithm:
    factory = algorithms.get(name)
    kwargs = REQUIRED_KWARGS.get(name, {})
    missing = [p for p in _required(factory) if p not in kwargs]
    assert not missing, (f"{name}: required arguments {missing}: add minimal values to "
                         f"REQUIRED_KWARGS in {__file__}")
    with warnings.catch_warnings():  # a construction warning is the algorithm's business
        warnings.simplefilter("ignore")
        algorithm = factory(**kwargs)
    assert isinstance(algorithm, Algorithm), f"{name}: {type(algorithm)} is not an Algorithm"
    return algorithm


def _state(batch: int = 2) -> State:
    """A real State, mid-run: a tiny classifier, its optimizer, a batch, batch 2 of 4."""
    model = SimpleModel()
    loader = make_dataloader(num_batches=4)
    state = State(model=model, max_duration="4ba", train_dataloader=loader, device="cpu",
                  optimizers=torch.optim.SGD(model.parameters(), lr=0.1))
    state.batch = next(iter(loader))
    state.timestamp = Timestamp(epoch=0, batch=batch, batch_in_epoch=batch, sample=4 * batch)
    return state


def _assert_same(a: Any, b: Any, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: keys differ"
        for key in a:
            _assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{where}: lengths differ"
        for index, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{index}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


@pytest.mark.parametrize("name", NAMES)
def test_constructs_with_defaults_and_state_dict_round_trips(name: str) -> None:
    algorithm = _build(name)
    saved = algorithm.state_dict()
    assert isinstance(saved, dict), f"{name}.state_dict() returned {type(saved)}"
    buffer = io.BytesIO()
    torch.save(saved, buffer)
    buffer.seek(0)
    read = torch.load(buffer, weights_only=True)  # how a checkpoint is read back
    fresh = _build(name)
    fresh.load_state_dict(read)
    _assert_same(fresh.state_dict(), saved, f"{name}.state_dict()")


@pytest.mark.parametrize("name", NAMES)
def test_declares_events_and_matches_nothing_else(name: str) -> None:
    algorithm = _build(name)
    events = algorithm.events
    assert events, f"{name} declares no events (Algorithm.events is {events!r})"
    assert all(isinstance(e, Event) for e in events), f"{name}.events: {events!r}"
    for state in (_state(batch=0), _state(batch=2)):
        wrong = [e.value for e in Event if e not in events and algorithm.match(e, state)]
        assert not wrong, f"{name}.match is True outside its events on: {wrong}"
