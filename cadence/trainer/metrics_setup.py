"""The run's metric objects: the model's train metrics and each evaluator's eval metrics, on
the device and synchronised over the data-parallel ranks."""

from __future__ import annotations

from typing import Any

from torch import nn

from cadence.core import State
from cadence.core.evaluator import filter_metrics
from cadence.parallel.data import sync_metrics_over

__all__ = ["build_metrics"]


def build_metrics(state: State, module: nn.Module, group: Any) -> None:
    """Set ``state.train_metrics`` and ``state.eval_metrics`` from ``module.get_metrics``
    (nothing without it); an evaluator's ``metric_names`` are regular expressions over the
    model's metric names (Composer's). The metrics sync over ``group`` (the data-parallel
    ranks: a tensor-parallel group shares its samples)."""
    get_metrics = getattr(module, "get_metrics", None)
    if get_metrics is None:
        return
    state.train_metrics = {k: m.to(state.device) for k, m in get_metrics(is_train=True).items()}
    for evaluator in state.evaluators:
        metrics = filter_metrics(get_metrics(is_train=False), evaluator.metric_names,
                                 evaluator.label)
        state.eval_metrics[evaluator.label] = {k: m.to(state.device) for k, m in metrics.items()}
    sync_metrics_over([*state.train_metrics.values(),
                       *(m for ms in state.eval_metrics.values() for m in ms.values())], group)
