"""GhostBatchNorm: batch normalization over fixed-size sub-batches ("ghost batches").

Source: Hoffer, Hubara and Soudry, "Train longer, generalize better: closing the
generalization gap in large batch training of neural networks", NeurIPS 2017
(https://arxiv.org/abs/1705.08741); MosaicML Composer's ``GhostBatchNorm`` /
``apply_ghost_batchnorm`` (``composer/algorithms/ghost_batchnorm/ghost_batchnorm.py``): same
names, argument and default (``ghost_batch_size=32``), ``Event.INIT``.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Optional, Sequence, Union

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from cadence.algorithms.surgery import InitSurgery
from cadence.registry import algorithms
from cadence.core import Event, State
from cadence.utils import module_surgery

__all__ = ["GhostBatchNorm", "GhostBatchNorm1d", "GhostBatchNorm2d", "GhostBatchNorm3d",
           "apply_ghost_batchnorm"]

log = logging.getLogger(__name__)


class _GhostBatchNorm(nn.Module):
    """Batch norm applied separately to chunks of ``ghost_batch_size`` samples along dim 0.

    ``[N, C, ...] -> [N, C, ...]``. In training, the batch is split into
    ``ceil(N / ghost_batch_size)`` chunks (``torch.chunk``: equal sizes but maybe a smaller
    last one), each normalized with its own mean and variance by the wrapped
    ``self.batchnorm`` (whose weight, bias and running statistics are kept, and which is
    what the ``state_dict`` holds under ``batchnorm.``). The running statistics are updated
    once per chunk with the momentum divided by the number of chunks, so one batch moves
    them about as much as plain batch norm would. In eval mode, the running statistics
    normalize each sample, so the whole batch goes through at once.

    Args:
        base_batchnorm: the ``BatchNorm1d/2d/3d`` to apply per chunk.
        ghost_batch_size: samples per chunk; default 32.

    Raises:
        ValueError: in training, the (per-rank) batch has fewer than ``ghost_batch_size``
            samples (so ghost batches would be the whole batch; with data parallelism the
            per-rank batch is the global batch over the number of ranks).
    """

    def __init__(self, base_batchnorm: _BatchNorm, ghost_batch_size: int = 32) -> None:
        super().__init__()
        if ghost_batch_size < 1:
            raise ValueError(f"ghost_batch_size must be >= 1, got {ghost_batch_size}.")
        self.ghost_batch_size = ghost_batch_size
        self.batchnorm = base_batchnorm
        self.batchnorm._already_ghost_batchnormed = True  # type: ignore[assignment]

    def extra_repr(self) -> str:
        return f"ghost_batch_size={self.ghost_batch_size}"

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return self.batchnorm(input)
        batch_size = input.shape[0]
        if batch_size < self.ghost_batch_size:
            raise ValueError(
                f"GhostBatchNorm: the per-rank batch has {batch_size} samples, fewer than "
                f"ghost_batch_size={self.ghost_batch_size}; lower ghost_batch_size or raise "
                f"the (micro)batch size.")
        num_chunks = math.ceil(batch_size / self.ghost_batch_size)
        momentum = self.batchnorm.momentum
        if momentum is not None:
            self.batchnorm.momentum = float(momentum) / num_chunks
        try:
            outputs = [self.batchnorm(chunk) for chunk in input.chunk(num_chunks, dim=0)]
        finally:
            self.batchnorm.momentum = momentum
        return torch.cat(outputs, dim=0)

    @staticmethod
    def from_batchnorm(module: _BatchNorm, ghost_batch_size: int = 32) -> _GhostBatchNorm:
        """The ghost twin of ``module`` (``BatchNorm1d`` -> :class:`GhostBatchNorm1d`, ...),
        wrapping ``module`` itself (its parameters and statistics)."""
        for bn_class, ghost_class in _GHOST_CLASSES:
            if isinstance(module, bn_class):
                return ghost_class(module, ghost_batch_size=ghost_batch_size)
        raise TypeError(f"from_batchnorm needs a BatchNorm1d/2d/3d, got {type(module).__name__}.")


class GhostBatchNorm1d(_GhostBatchNorm):
    """Ghost batch norm around a ``BatchNorm1d``: ``[N, C]`` or ``[N, C, L]``."""


class GhostBatchNorm2d(_GhostBatchNorm):
    """Ghost batch norm around a ``BatchNorm2d``: ``[N, C, H, W]``."""


class GhostBatchNorm3d(_GhostBatchNorm):
    """Ghost batch norm around a ``BatchNorm3d``: ``[N, C, D, H, W]``."""


_GHOST_CLASSES: tuple[tuple[type[_BatchNorm], type[_GhostBatchNorm]], ...] = (
    (nn.BatchNorm1d, GhostBatchNorm1d),
    (nn.BatchNorm2d, GhostBatchNorm2d),
    (nn.BatchNorm3d, GhostBatchNorm3d),
)


def apply_ghost_batchnorm(model: nn.Module, ghost_batch_size: int = 32,
                          optimizers: Optional[Union[torch.optim.Optimizer,
                                                     Sequence[torch.optim.Optimizer]]] = None
                          ) -> nn.Module:
    """Wrap every ``BatchNorm1d/2d/3d`` of ``model`` in a :class:`GhostBatchNorm1d/2d/3d`,
    in place (Hoffer et al. 2017). The batch norms keep their parameters, so optimizers need
    no update; ``optimizers`` is accepted for Composer's signature. Applying it twice wraps
    nothing more. ``SyncBatchNorm`` is left alone (it normalizes across ranks by design).

    Args:
        model: the model to modify (not yet wrapped or sharded).
        ghost_batch_size: samples per ghost batch; default 32.
        optimizers: optimizers built on ``model.parameters()`` (updated if needed).

    Returns:
        ``model``.

    Raises:
        ValueError: ``ghost_batch_size < 1``.
        TypeError: ``model`` is already parallelized (DDP / FSDP).
    """
    if ghost_batch_size < 1:
        raise ValueError(f"ghost_batch_size must be >= 1, got {ghost_batch_size}.")

    def maybe_wrap(module: nn.Module, module_index: int) -> Optional[nn.Module]:
        del module_index
        if getattr(module, "_already_ghost_batchnormed", False):
            return None
        return _GhostBatchNorm.from_batchnorm(module, ghost_batch_size)  # type: ignore[arg-type]

    policies = {bn_class: maybe_wrap for bn_class, _ in _GHOST_CLASSES}
    module_surgery.replace_module_classes(model, policies, optimizers=optimizers)
    return model


@algorithms.register("ghost_batchnorm")
class GhostBatchNorm(InitSurgery):
    """Ghost batch normalization (Hoffer et al. 2017) at ``Event.INIT``: every batch norm
    normalizes each chunk of ``ghost_batch_size`` samples of a ``[N, C, ...]`` batch with the
    chunk's own statistics, the regularizing noise of small batches in a large-batch run
    (see :class:`GhostBatchNorm2d`).

    Args:
        ghost_batch_size: samples per ghost batch; default 32. Each rank's training
            (micro)batch must hold at least this many.

    Raises:
        ValueError: ``ghost_batch_size < 1``.

    Logs the hyperparameter ``GhostBatchNorm/num_new_modules``.

    Example (YAML)::

        algorithms:
          ghost_batchnorm: {ghost_batch_size: 16}
    """

    def __init__(self, ghost_batch_size: int = 32) -> None:
        if ghost_batch_size < 1:
            raise ValueError(f"GhostBatchNorm: ghost_batch_size must be >= 1, got "
                             f"{ghost_batch_size}.")
        self.ghost_batch_size = ghost_batch_size

    def __repr__(self) -> str:
        return f"GhostBatchNorm(ghost_batch_size={self.ghost_batch_size})"

    def apply(self, event: Event, state: State, logger: Any) -> None:
        apply_ghost_batchnorm(state.model, ghost_batch_size=self.ghost_batch_size,
                              optimizers=state.optimizers)
        count = module_surgery.count_module_instances(state.model, _GhostBatchNorm)
        log.info("Applied GhostBatchNorm (ghost_batch_size=%d) to %s: %d modules.",
                 self.ghost_batch_size, type(state.model).__name__, count)
        logger.log_hyperparameters({"GhostBatchNorm/num_new_modules": count})
