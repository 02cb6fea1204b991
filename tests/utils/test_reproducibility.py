"""Composer's RNG helpers in cadence.utils.reproducibility: get_rng_state / load_rng_state
round trip, seed_context, MAX_SEED."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
import torch

from cadence.utils import reproducibility


def _draws() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def test_saved_rng_state_restores_every_generator_and_loads_weights_only() -> None:
    reproducibility.seed_all(123)
    states = reproducibility.get_rng_state()
    assert len(states) == 1  # one entry per rank
    expected = _draws()
    buffer = io.BytesIO()
    torch.save(states, buffer)
    buffer.seek(0)
    _draws()  # move every generator on
    reproducibility.load_rng_state(torch.load(buffer, weights_only=True))
    assert _draws() == expected


def test_more_states_than_ranks_warns_and_uses_its_own() -> None:
    reproducibility.seed_all(5)
    mine = reproducibility.get_rng_state()[0]
    expected = _draws()
    with pytest.warns(UserWarning, match="2 RNG state"):
        reproducibility.load_rng_state([mine, mine])
    assert _draws() == expected
    with pytest.raises(ValueError, match="get_rng_state"):
        reproducibility.load_rng_state([])


def test_seed_context_seeds_inside_and_restores_outside() -> None:
    reproducibility.seed_all(7)
    outside = _draws()
    reproducibility.seed_all(7)
    with reproducibility.seed_context(99):
        inside = _draws()
    assert _draws() == outside  # as if the block had not run
    reproducibility.seed_all(99)
    assert _draws() == inside


def test_max_seed_is_the_largest_seed_taken() -> None:
    reproducibility.seed_all(reproducibility.MAX_SEED)
    with pytest.raises(ValueError, match="seed"):
        reproducibility.seed_all(reproducibility.MAX_SEED + 1)
