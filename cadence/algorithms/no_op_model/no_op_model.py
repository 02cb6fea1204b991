"""NoOpModel: swap the model for one with a single weight, to time everything but the model.

Source: MosaicML Composer's ``NoOpModel`` / ``NoOpModelClass``
(``composer/algorithms/no_op_model/no_op_model.py``): a tool for measuring the data
pipeline, the loop and the callbacks without the model's cost (no paper).
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.classification import BinaryAccuracy

from cadence.registry import algorithms
from cadence.core import Algorithm, Event, State
from cadence.models.base import ComposerModel

__all__ = ["NoOpModel", "NoOpModelClass"]

log = logging.getLogger(__name__)


def _targets(batch: Any) -> torch.Tensor:
    """``y`` of a batch ``(x, y)``."""
    if not isinstance(batch, (tuple, list)) or len(batch) != 2 or \
            not isinstance(batch[1], torch.Tensor):
        raise TypeError(f"NoOpModel needs batches (inputs, targets) with a tensor of targets, "
                        f"got {type(batch).__name__}.")
    return batch[1]


class NoOpModelClass(ComposerModel):
    """A model of one parameter ``weights`` (``[1]``, 1.5) that ignores its inputs.

    Batches are ``(x, y)``: ``forward`` returns ``y * weights`` (``y``'s shape, float), the
    loss is the mean squared error between that and ``y`` (a 0-d tensor, so there is a
    gradient to step with), ``eval_forward`` returns ``y``, and the metric is
    ``BinaryAccuracy`` of the outputs against ``y``.

    Args:
        original_model: the model it replaces: its first parameter's device is used, and
            its ``num_classes``, if it has one, is kept.

    Raises:
        TypeError: a batch that is not ``(inputs, target tensor)``.
    """

    def __init__(self, original_model: nn.Module) -> None:
        super().__init__()
        first = next(original_model.parameters(), None)
        device = first.device if first is not None else None
        self.weights = nn.Parameter(torch.tensor([1.5], device=device))
        num_classes = getattr(original_model, "num_classes", None)
        if num_classes is not None:
            self.num_classes = num_classes

    def forward(self, batch: Any) -> torch.Tensor:
        return _targets(batch) * self.weights

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return F.mse_loss(outputs, _targets(batch).to(torch.float32))

    def eval_forward(self, batch: Any, outputs: Optional[Any] = None) -> torch.Tensor:
        return _targets(batch)

    def get_metrics(self, is_train: bool = False) -> dict[str, Any]:
        return {"BinaryAccuracy": BinaryAccuracy()}

    def update_metric(self, batch: Any, outputs: Any, metric: Any) -> None:
        metric.update(outputs, _targets(batch))


@algorithms.register("no_op_model")
class NoOpModel(Algorithm):
    """Replaces the model with a :class:`NoOpModelClass` at ``INIT`` (before it is wrapped
    or sharded). The optimizer's parameters become the new model's one weight (in its first
    parameter group; the old parameters and their state leave every group). No arguments.

    Example (YAML)::

        algorithms:
          no_op_model: {}
    """

    events = frozenset({Event.INIT})

    def __init__(self) -> None:
        pass

    def __repr__(self) -> str:
        return "NoOpModel()"

    def match(self, event: Event, state: State) -> bool:
        return event == Event.INIT

    def apply(self, event: Event, state: State, logger: Any) -> None:
        new_model = NoOpModelClass(state.model)
        for index, optimizer in enumerate(state.optimizers):
            for number, group in enumerate(optimizer.param_groups):
                for param in group["params"]:
                    optimizer.state.pop(param, None)
                first = index == 0 and number == 0
                group["params"] = [new_model.weights] if first else []
        state.model = new_model
        log.info("NoOpModel replaced the model.")
