"""The train and eval metrics in a checkpoint (``Trainer(save_metrics=True)``).

Stored under ``train_metrics`` (metric name -> entry) and ``eval_metrics`` (evaluator label
-> metric name -> entry), as Composer's ``State.state_dict`` stores them; each entry is
``{"state_dict": {state name: tensor or list of tensors}, "_computed": value}``: the
metric's accumulated states (``torchmetrics.Metric.add_state`` names) and its cached last
``compute()``. Only tensors and plain numbers are kept, so the checkpoint still loads with
``weights_only=True``; a metric's persistence flags (whether its states are in the model's
``state_dict``) are not touched.

Source: Composer 0.32.1 ``State.state_dict`` / ``State.load_state_dict`` (metrics);
torchmetrics ``Metric.add_state``.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import torch

__all__ = ["load_metrics_state", "metrics_state"]

log = logging.getLogger(__name__)


def _plain(value: Any) -> Any:
    """A CPU copy of a tensor (or a list / tuple of them), a number, or None (anything else:
    not savable as plain data)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, (list, tuple)):
        items = [_plain(v) for v in value]
        return None if any(i is None for i in items) else items
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    return None


def _entry(metric: Any) -> dict[str, Any]:
    states = {name: _plain(getattr(metric, name)) for name in getattr(metric, "_defaults", {})}
    return {"state_dict": {k: v for k, v in states.items() if v is not None},
            "_computed": _plain(getattr(metric, "_computed", None))}


def metrics_state(state: Any) -> dict[str, Any]:
    """``{"train_metrics": ..., "eval_metrics": ...}`` of ``state`` (see the module docstring)."""
    return {"train_metrics": {name: _entry(m) for name, m in state.train_metrics.items()},
            "eval_metrics": {label: {name: _entry(m) for name, m in metrics.items()}
                             for label, metrics in state.eval_metrics.items()}}


def _restore(metric: Any, entry: Any, where: str) -> None:
    if not isinstance(entry, dict):
        return
    device: Optional[torch.device] = getattr(metric, "device", None)
    for name, value in (entry.get("state_dict") or {}).items():
        if name not in getattr(metric, "_defaults", {}):
            log.warning("Checkpoint metric %s has a state %r this metric lacks; skipped.",
                        where, name)
            continue
        if isinstance(value, torch.Tensor) and device is not None:
            value = value.to(device)
        elif isinstance(value, list) and device is not None:
            value = [v.to(device) if isinstance(v, torch.Tensor) else v for v in value]
        setattr(metric, name, value)
    computed = entry.get("_computed")
    if computed is not None:
        metric._computed = computed


def load_metrics_state(state: Any, saved: dict[str, Any]) -> None:
    """Restore what :func:`metrics_state` saved into ``state``'s metrics of the same names
    (a metric the checkpoint lacks, or one the run lacks, is left as it is)."""
    for name, entry in (saved.get("train_metrics") or {}).items():
        if name in state.train_metrics:
            _restore(state.train_metrics[name], entry, f"train_metrics/{name}")
    for label, metrics in (saved.get("eval_metrics") or {}).items():
        for name, entry in (metrics or {}).items():
            if name in state.eval_metrics.get(label, {}):
                _restore(state.eval_metrics[label][name], entry, f"eval_metrics/{label}/{name}")
