"""Algorithm passes as pure functions (Composer's ``composer/core/passes.py``)."""

from __future__ import annotations

import pytest

from cadence.core import Event
from cadence.core.passes import (
    reverse_on_after_events, set_filo_order, sort_to_back, sort_to_front,
    warn_if_multiple_loss_interpolation,
)


def test_sort_to_front_and_back_as_documented() -> None:
    items = [1, "b", 3]
    assert sort_to_front(items, str) == ["b", 1, 3]
    assert sort_to_back(items, str) == [1, 3, "b"]
    assert sort_to_front([1, "a", 2, "b"], str) == ["a", "b", 1, 2]  # stable within groups
    assert items == [1, "b", 3]  # pure


def test_filo_order_reverses_only_after_events() -> None:
    assert set_filo_order is reverse_on_after_events
    assert list(set_filo_order([1, 2, 3], Event.AFTER_FORWARD)) == [3, 2, 1]
    assert list(set_filo_order([1, 2, 3], Event.BEFORE_FORWARD)) == [1, 2, 3]
    assert list(set_filo_order([1, 2, 3], Event.BATCH_END)) == [1, 2, 3]


def test_warns_when_several_algorithms_interpolate_the_loss() -> None:
    class Interp:
        interpolate_loss = True

    class Plain:
        pass

    algos = [Interp(), Plain()]
    assert warn_if_multiple_loss_interpolation(algos, Event.BEFORE_LOSS) is algos
    with pytest.warns(UserWarning, match="interpolate the loss"):
        warn_if_multiple_loss_interpolation([Interp(), Interp()], Event.BEFORE_LOSS)


def test_default_passes_run_selective_backprop_first_and_low_precision_layernorm_last() -> None:
    """Composer's two ordering passes are defaults; subclasses count, other classes with the
    same name (outside cadence.algorithms) do not."""
    from cadence.algorithms import LowPrecisionLayerNorm, MixUp, SelectiveBackprop
    from cadence.core.passes import DEFAULT_PASSES, order_algorithms

    class MySB(SelectiveBackprop):
        pass

    class LowPrecisionLayerNormLookalike:
        pass

    lpln, mix, sb, other = LowPrecisionLayerNorm(), MixUp(), MySB(), LowPrecisionLayerNormLookalike()
    assert list(order_algorithms([lpln, mix, other, sb], Event.INIT)) == [sb, mix, other, lpln]
    # on an AFTER_* event the reversal comes after the sorts, as in Composer
    assert list(order_algorithms([lpln, mix, sb], Event.AFTER_LOSS)) == [lpln, mix, sb]
    assert DEFAULT_PASSES[-2:] == (reverse_on_after_events, warn_if_multiple_loss_interpolation)
