"""WeightStandardization: each conv filter reparametrized to zero mean and unit variance.

Source: Qiao, Wang, Liu, Shen and Yuille, "Micro-Batch Training with Batch-Channel
Normalization and Weight Standardization", 2019 (https://arxiv.org/abs/1903.10520);
MosaicML Composer's ``WeightStandardization`` / ``apply_weight_standardization``
(``composer/algorithms/weight_standardization/weight_standardization.py``): same names,
argument and default (``n_last_layers_ignore=0``), ``Event.INIT``, the same epsilon.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.utils.parametrize as parametrize
from torch import nn

from cadence.registry import algorithms
from cadence.core import Algorithm, Event, State
from cadence.utils.module_surgery import _refuse_wrapped

__all__ = ["WeightStandardization", "WeightStandardizer", "apply_weight_standardization"]

log = logging.getLogger(__name__)

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_EPS = 1e-10  # added to the variance (Composer's value)


def _standardize_weights(weight: torch.Tensor) -> torch.Tensor:
    """``(W - mean) / sqrt(var + 1e-10)`` per output channel: over every dim but the first,
    population variance; ``[C_out, C_in, *k] -> [C_out, C_in, *k]``."""
    dims = tuple(range(1, weight.ndim))
    var, mean = torch.var_mean(weight, dim=dims, keepdim=True, correction=0)
    return (weight - mean) / torch.sqrt(var + _EPS)


class WeightStandardizer(nn.Module):
    """The parametrization ``weight -> standardized weight`` (``torch.nn.utils.parametrize``):
    the conv trains ``parametrizations.weight.original`` and computes with its standardized
    form, so gradients flow through the standardization (as the paper requires)."""

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return _standardize_weights(weight)


def _convs_in_execution_order(module: nn.Module, n_last_layers_ignore: int) -> list[nn.Module]:
    """The convs of ``module`` in the order its forward calls them when ``torch.fx`` can
    trace it, else in registration order (a warning when that order matters)."""
    # a ComposerClassifier's forward unpacks a batch, which fx cannot trace: try its network
    for traced in (module, getattr(module, "module", None)):
        if not isinstance(traced, nn.Module):
            continue
        try:
            graph = torch.fx.symbolic_trace(traced).graph
        except Exception:  # noqa: BLE001 - an untraceable forward: try the next, or give up
            continue
        ordered: list[nn.Module] = []
        for node in graph.nodes:
            if node.op == "call_module":
                sub = traced.get_submodule(str(node.target))
                if isinstance(sub, _CONVS) and sub not in ordered:
                    ordered.append(sub)
        rest = [m for m in module.modules() if isinstance(m, _CONVS) and m not in ordered]
        return rest + ordered  # convs fx did not see (outside the traced net) come first
    if n_last_layers_ignore > 0:
        log.warning("WeightStandardization: %s could not be traced by torch.fx, so the "
                    "%d 'last' convs left alone are the last registered, which may not be "
                    "the last executed.", type(module).__name__, n_last_layers_ignore)
    return [m for m in module.modules() if isinstance(m, _CONVS)]


def apply_weight_standardization(module: nn.Module, n_last_layers_ignore: int = 0) -> int:
    """Weight-standardize the ``Conv1d/2d/3d`` layers of ``module`` in place (Qiao et al.
    2019): each output channel's filter ``W[c]`` (``[C_in, *kernel]``) is used as
    ``(W[c] - mean(W[c])) / sqrt(var(W[c]) + 1e-10)``, through a ``torch.nn.utils.parametrize``
    parametrization (:class:`WeightStandardizer`). The trained ``Parameter`` is the original
    tensor object, so optimizers need no update; its ``state_dict`` key becomes
    ``<conv>.parametrizations.weight.original``. Convs already standardized are skipped.

    Args:
        module: the model to modify (not yet wrapped or sharded).
        n_last_layers_ignore: how many convs at the end of the network (in execution order
            when ``torch.fx`` can trace ``module``, else registration order) to leave
            alone, e.g. a conv classifier head; default 0.

    Returns:
        The number of convs standardized.

    Raises:
        ValueError: ``n_last_layers_ignore < 0``.
        TypeError: ``module`` is already parallelized (DDP / FSDP).
    """
    if n_last_layers_ignore < 0:
        raise ValueError(f"n_last_layers_ignore must be >= 0, got {n_last_layers_ignore}.")
    _refuse_wrapped(module)
    convs = _convs_in_execution_order(module, n_last_layers_ignore)
    targets = convs[:max(len(convs) - n_last_layers_ignore, 0)]
    count = 0
    for conv in targets:
        already = parametrize.is_parametrized(conv, "weight") and any(
            isinstance(p, WeightStandardizer) for p in conv.parametrizations["weight"])
        if not already:
            parametrize.register_parametrization(conv, "weight", WeightStandardizer())
            count += 1
    return count


@algorithms.register("weight_standardization")
class WeightStandardization(Algorithm):
    """Weight Standardization (Qiao et al. 2019) at ``Event.INIT``: every conv's filters
    ``[C_out, C_in, *kernel]`` are used standardized per output channel (zero mean, unit
    variance); see :func:`apply_weight_standardization`. Usually paired with GroupNorm.

    Args:
        n_last_layers_ignore: convs at the end of the network to leave alone; default 0.

    Raises:
        ValueError: ``n_last_layers_ignore < 0``.

    Logs the hyperparameter ``WeightStandardization/num_weights_standardized``.

    Example (YAML)::

        algorithms:
          weight_standardization: {n_last_layers_ignore: 1}
    """

    events = frozenset({Event.INIT})

    def __init__(self, n_last_layers_ignore: int = 0) -> None:
        if n_last_layers_ignore < 0:
            raise ValueError(f"WeightStandardization: n_last_layers_ignore must be >= 0, got "
                             f"{n_last_layers_ignore}.")
        self.n_last_layers_ignore = n_last_layers_ignore

    def __repr__(self) -> str:
        return f"WeightStandardization(n_last_layers_ignore={self.n_last_layers_ignore})"

    def match(self, event: Event, state: State) -> bool:
        return event == Event.INIT

    def apply(self, event: Event, state: State, logger: Any) -> None:
        count = apply_weight_standardization(state.model,
                                             n_last_layers_ignore=self.n_last_layers_ignore)
        logger.log_hyperparameters({"WeightStandardization/num_weights_standardized": count})
