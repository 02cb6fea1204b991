"""Layer freezing: stop training the earliest layers, more of them as training goes on.

Source: Brock, Lim, Ritchie and Weston, "FreezeOut: Accelerate Training by Progressively
Freezing Layers", NeurIPS 2017 workshop (arXiv:1706.04983); MosaicML Composer's
``LayerFreezing`` / ``freeze_layers``
(``composer/algorithms/layer_freezing/layer_freezing.py``): same arguments, defaults, event
and schedule.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Union

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from cadence.registry import algorithms
from cadence.core import Algorithm, Event, State

__all__ = ["LayerFreezing", "freeze_layers"]


def _leaf_layers(model: nn.Module) -> list[nn.Module]:
    """The model's leaf modules (no children), in registration order, first to last."""
    return [m for m in model.modules() if next(m.children(), None) is None]


def _freeze_fraction(current_duration: float, freeze_start: float, freeze_level: float) -> float:
    """0 until ``freeze_start``, then rising linearly to ``freeze_level`` at the end."""
    if current_duration <= freeze_start:
        return 0.0
    return (current_duration - freeze_start) / (1.0 - freeze_start) * freeze_level


def _check_args(freeze_start: float, freeze_level: float) -> None:
    if not 0.0 <= freeze_start < 1.0:
        raise ValueError(f"freeze_start must be in [0, 1), got {freeze_start}.")
    if not 0.0 <= freeze_level <= 1.0:
        raise ValueError(f"freeze_level must be in [0, 1], got {freeze_level}.")


def freeze_layers(model: nn.Module,
                  optimizers: Union[torch.optim.Optimizer, Iterable[torch.optim.Optimizer], None],
                  current_duration: float, freeze_start: float = 0.5,
                  freeze_level: float = 1.0) -> tuple[int, float]:
    """Freeze the first layers of ``model`` for the point ``current_duration`` of training.

    The layers are the model's leaf modules in registration order (for GPT-2: the
    embeddings, then each block's norms, attention and MLP projections, ..., the head);
    the last one (the output head) is never frozen. The fraction frozen is 0 until
    ``freeze_start`` and then grows linearly to ``freeze_level`` at the end of training;
    ``int(fraction * (layers - 1))`` layers are frozen. Freezing only ever grows: layers
    frozen earlier stay frozen.

    A frozen parameter gets ``requires_grad = False`` and its gradient is dropped, so
    autograd computes no gradient for it and the optimizers skip it (a torch optimizer
    updates, decays and keeps momentum only for parameters with a gradient); it stays in
    the optimizers' parameter groups, so their state keeps its layout and a checkpoint taken
    after freezing resumes exactly. A parameter shared with a layer that is still trained
    (GPT-2's input embedding, tied to the output head) is not frozen. Under FSDP2 the
    sharded parameters are frozen and FSDP carries the flag to the gathered ones.

    Args:
        model: the model; for FSDP2, the sharded model.
        optimizers: the run's optimizer(s); their gradients of frozen parameters are dropped.
        current_duration: the elapsed fraction of training, in ``[0, 1]``.
        freeze_start: the fraction of training at which freezing starts; default 0.5.
        freeze_level: the fraction of the layers frozen at the end; default 1.0.

    Returns:
        ``(freeze_depth, freeze_fraction)``: how many leading layers are frozen now, and the
        scheduled fraction.

    Raises:
        ValueError: ``freeze_start`` outside ``[0, 1)`` or ``freeze_level`` outside ``[0, 1]``.
    """
    _check_args(freeze_start, freeze_level)
    _reshard(model)
    layers = _leaf_layers(model)
    fraction = _freeze_fraction(float(current_duration), freeze_start, freeze_level)
    depth = int(fraction * len(layers[:-1]))
    _freeze(layers, depth)
    del optimizers  # frozen parameters have no gradient: every torch optimizer skips them
    return depth, fraction


def _reshard(model: nn.Module) -> None:
    """Put FSDP2's sharded parameters back on the modules (after a forward without backward,
    the root unit may still hold gathered copies): the flag must go on the sharded ones,
    which FSDP2 copies to the gathered ones at every all-gather."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def _freeze(layers: list[nn.Module], depth: int) -> None:
    trained = {id(p) for layer in layers[depth:] for p in layer.parameters(recurse=False)}
    for layer in layers[:depth]:
        for param in layer.parameters(recurse=False):
            if id(param) in trained:
                continue  # shared with a layer still trained (tied embeddings)
            param.requires_grad_(False)
            param.grad = None


@algorithms.register("layer_freezing")
class LayerFreezing(Algorithm):
    """Progressively freezes the model's first layers (Brock et al. 2017, FreezeOut).

    At each ``EPOCH_END`` :func:`freeze_layers` freezes the first
    ``int(fraction * (layers - 1))`` leaf layers, where ``fraction`` is 0 until
    ``freeze_start`` of training and then rises linearly to ``freeze_level``. Parameters
    keep their shapes (``[out, in]`` weights, ``[out]`` biases); a frozen one gets no
    gradient, so backward stops early and the optimizer skips it.

    Stateful: :meth:`state_dict` holds the number of frozen layers, and
    :meth:`load_state_dict` freezes them again, so a resumed run trains exactly the layers
    the interrupted one did (Composer cannot resume such a run and warns instead).

    Args:
        freeze_start: fraction of training after which freezing starts, in ``[0, 1)``;
            default 0.5.
        freeze_level: fraction of the layers frozen by the end of training, in ``[0, 1]``;
            default 1.0.

    Raises:
        ValueError: an argument outside its range.

    Example (YAML)::

        algorithms:
          layer_freezing: {freeze_start: 0.5, freeze_level: 1.0}
    """

    events = frozenset({Event.INIT, Event.EPOCH_END})

    def __init__(self, freeze_start: float = 0.5, freeze_level: float = 1.0) -> None:
        _check_args(freeze_start, freeze_level)
        self.freeze_start = float(freeze_start)
        self.freeze_level = float(freeze_level)
        self.freeze_depth = 0
        self._model: Optional[nn.Module] = None

    @property
    def find_unused_parameters(self) -> bool:
        """Frozen layers take no gradient: DDP must not wait for them (Composer's flag)."""
        return True

    def match(self, event: Event, state: State) -> bool:
        return event in (Event.INIT, Event.EPOCH_END)

    def apply(self, event: Event, state: State, logger: Any) -> None:
        self._model = state.model
        if event == Event.INIT:
            self._restore()
            return
        elapsed = state.get_elapsed_duration()
        assert elapsed is not None, "max_duration is set before training"
        depth, fraction = freeze_layers(state.model, state.optimizers, float(elapsed),
                                        self.freeze_start, self.freeze_level)
        self.freeze_depth = max(self.freeze_depth, depth)
        if logger is not None:
            logger.log_metrics({"layer_freezing/layers_frozen": depth,
                                "layer_freezing/percentage_frozen": fraction})

    def _restore(self) -> None:
        if self._model is not None and self.freeze_depth:
            _reshard(self._model)
            _freeze(_leaf_layers(self._model), self.freeze_depth)

    def state_dict(self) -> dict[str, Any]:
        """``{"freeze_depth": int}``: how many leading layers are frozen."""
        return {"freeze_depth": self.freeze_depth}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Freeze the checkpoint's ``freeze_depth`` layers again (now, or at ``INIT``)."""
        self.freeze_depth = int(state.get("freeze_depth", 0))
        self._restore()
