"""Ordering rules for algorithms, as small pure functions.

A pass takes the algorithms that matched an event and returns them in the order to run
(it may also drop some). The :class:`~cadence.core.engine.Engine` applies its passes
in turn on every event where an algorithm matched; add one with ``Engine.register_pass`` or
the Trainer's ``algorithm_passes``. Source: Composer's ``composer/core/passes.py``.

Example: run ``MyAlgorithm`` last::

    def run_last(algorithms, event):
        return sort_to_back(algorithms, MyAlgorithm)

    Trainer(..., algorithm_passes=run_last)
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Sequence, TypeVar

from cadence.core.event import Event

__all__ = [
    "AlgorithmPass", "reverse_on_after_events", "set_filo_order", "sort_to_front",
    "sort_selective_backprop_first", "sort_low_precision_layernorm_last",
    "sort_to_back", "warn_if_multiple_loss_interpolation", "DEFAULT_PASSES",
    "order_algorithms",
]

T = TypeVar("T")
AlgorithmPass = Callable[[Sequence[Any], Event], Sequence[Any]]


def sort_to_front(list_to_sort: Sequence[T], cls: Any) -> Sequence[T]:
    """The instances of ``cls`` first, the rest after; each group keeps its order.

    ``sort_to_front([1, "b", 3], str) == ["b", 1, 3]``.
    """
    return sorted(list_to_sort, key=lambda item: not isinstance(item, cls))


def sort_to_back(list_to_sort: Sequence[T], cls: Any) -> Sequence[T]:
    """The instances of ``cls`` last, the rest before; each group keeps its order.

    ``sort_to_back([1, "b", 3], str) == [1, 3, "b"]``.
    """
    return sorted(list_to_sort, key=lambda item: isinstance(item, cls))


def reverse_on_after_events(algorithms: Sequence[T], event: Event) -> Sequence[T]:
    """Run algorithms in reverse on ``AFTER_*`` (and ``EVAL_AFTER_*``) events, so each undoes
    its ``BEFORE_*`` work in the opposite order (like nested context managers).

    Composer's ``set_filo_order`` reverses on ``AFTER_*`` only; cadence also reverses on
    ``EVAL_AFTER_FORWARD``, the pair of ``EVAL_BEFORE_FORWARD``.
    """
    if event.is_after_event:
        return list(reversed(algorithms))
    return algorithms


#: Composer's name for :func:`reverse_on_after_events`.
set_filo_order = reverse_on_after_events


def warn_if_multiple_loss_interpolation(algorithms: Sequence[T], event: Event) -> Sequence[T]:
    """Warn when more than one algorithm interpolates the loss (their ``interpolate_loss``
    attribute is true): the combination is rarely what was meant (Composer's pass)."""
    del event
    # `is True`: a duck-typed algorithm (a Mock) answers any attribute with a truthy object
    interpolating = [a for a in algorithms if getattr(a, "interpolate_loss", False) is True]
    if len(interpolating) > 1:
        warnings.warn(f"Several algorithms interpolate the loss: {interpolating}; the result "
                      f"may not be what you expect.", UserWarning, stacklevel=2)
    return algorithms


def _is_cadence_algorithm(item: Any, name: str) -> bool:
    """Whether ``item`` is (a subclass of) cadence's algorithm class ``name``; by name, as
    ``cadence.core`` imports nothing from ``cadence.algorithms``."""
    return any(cls.__name__ == name and cls.__module__.startswith("cadence.algorithms.")
               for cls in type(item).__mro__)


def sort_selective_backprop_first(algorithms: Sequence[T], event: Event) -> Sequence[T]:
    """Run ``SelectiveBackprop`` before the other algorithms (Composer's pass): it scores the
    batch by loss at ``AFTER_DATALOADER``, which must see the batch before augmentations
    (MixUp, CutMix, ...) change it. Stable for the rest."""
    del event
    return sorted(algorithms, key=lambda a: not _is_cadence_algorithm(a, "SelectiveBackprop"))


def sort_low_precision_layernorm_last(algorithms: Sequence[T], event: Event) -> Sequence[T]:
    """Run ``LowPrecisionLayerNorm`` after the other algorithms (Composer's pass), so the
    LayerNorms that they add (e.g. ``GatedLinearUnits``) are converted too. Stable for the
    rest."""
    del event
    return sorted(algorithms, key=lambda a: _is_cadence_algorithm(a, "LowPrecisionLayerNorm"))


#: Composer's default passes, in its order.
DEFAULT_PASSES: tuple[AlgorithmPass, ...] = (
    sort_selective_backprop_first, sort_low_precision_layernorm_last, reverse_on_after_events,
    warn_if_multiple_loss_interpolation,
)


def order_algorithms(
    algorithms: Sequence[T], event: Event, passes: Sequence[AlgorithmPass] = DEFAULT_PASSES
) -> Sequence[T]:
    """Apply each pass in turn to ``algorithms`` for ``event``."""
    for algorithm_pass in passes:
        algorithms = algorithm_pass(algorithms, event)
    return algorithms
