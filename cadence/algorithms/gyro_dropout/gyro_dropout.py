"""Gyro dropout: dropout that trains a fixed, pre-selected set of subnetworks.

Source: Park et al., "Gyro Dropout: Maximizing Ensemble Effect in Neural Network Training",
MLSys 2022 (https://proceedings.mlsys.org/paper_files/paper/2022/hash/be83ab3ecd0db773eb2dc1b0a17836a1-Abstract.html);
MosaicML Composer's ``GyroDropout`` / ``GyroDropoutLayer`` / ``apply_gyro_dropout``
(``composer/algorithms/gyro_dropout/gyro_dropout.py``), same arguments and defaults.
"""

from __future__ import annotations

import logging
import math
import warnings
from functools import partial
from typing import Any, Optional

import torch
from torch import nn

from cadence.algorithms.warnings import NoEffectWarning
from cadence.registry import algorithms
from cadence.core import Algorithm, Event, State, TimeUnit
from cadence.utils import module_surgery

__all__ = ["GyroDropout", "GyroDropoutLayer", "apply_gyro_dropout"]

log = logging.getLogger(__name__)


def _check(p: float, sigma: int, tau: int) -> None:
    if not 0 <= p < 1:
        raise ValueError(f"p must be in [0, 1) (the fraction of features dropped), got {p}.")
    if int(sigma) != sigma or sigma < 1:
        raise ValueError(f"sigma must be an integer >= 1 (subnetworks pre-selected), got "
                         f"{sigma!r}.")
    if int(tau) != tau or not 1 <= tau <= sigma:
        raise ValueError(f"tau must be an integer in [1, sigma={sigma}] (subnetworks per "
                         f"batch), got {tau!r}.")


class GyroDropoutLayer(nn.Module):
    """Dropout over ``sigma`` masks drawn once (Park et al. 2022), ``tau`` of them per batch.

    Input ``x``: ``[batch, features, *]`` (the mask is over dim 1, broadcast over the rest);
    the output has its shape. In training, the ``sigma`` masks (each ``[features]``, a
    feature kept with probability ``1 - p``) are drawn at the first forward; every
    ``iter_num = int(iters_per_epoch * max_epoch / sigma) * tau`` steps (at least 1) ``tau``
    of them are picked (with replacement), and the batch is split into ``tau`` contiguous
    blocks of ``ceil(batch / tau)`` samples, block ``i`` using mask ``i``. Kept features are
    scaled by ``1 / (1 - p)``. In eval mode it is the identity.

    The masks and picks come from a seed and the step count, both buffers (0-d int64) of
    the model, so checkpoints restore them exactly (Composer draws them from NumPy's global
    RNG and warns that it does not resume).

    Args:
        iters_per_epoch: batches per epoch; None until known (set before training).
        max_epoch: epochs of training; with ``iters_per_epoch``, the run's total steps.
        p: fraction of features dropped, in [0, 1).
        sigma: masks pre-selected, >= 1.
        tau: masks per batch, in [1, sigma].

    Raises:
        ValueError: bad ``p``, ``sigma`` or ``tau``; an input of fewer than 2 dims; training
            before ``iters_per_epoch`` and ``max_epoch`` are set.
    """

    def __init__(self, iters_per_epoch: Optional[int], max_epoch: Optional[int], p: float,
                 sigma: int, tau: int) -> None:
        super().__init__()
        _check(p, sigma, tau)
        self.iters_per_epoch, self.max_epoch = iters_per_epoch, max_epoch
        self.p, self.sigma, self.tau = float(p), int(sigma), int(tau)
        self.register_buffer("seed", torch.randint(0, 2 ** 62, (), dtype=torch.int64))
        self.register_buffer("training_step", torch.zeros((), dtype=torch.int64))
        self._step: Optional[int] = 0  # a host copy of training_step (None: read it)
        self._cache: dict[Any, torch.Tensor] = {}
        self.register_load_state_dict_post_hook(GyroDropoutLayer._forget)

    @staticmethod
    def _forget(module: nn.Module, incompatible_keys: Any) -> None:
        """After a load: masks and step come from the loaded buffers."""
        assert isinstance(module, GyroDropoutLayer)
        module._step, module._cache = None, {}

    @property
    def iter_num(self) -> int:
        """Steps between two picks of ``tau`` masks."""
        if self.iters_per_epoch is None or self.max_epoch is None:
            raise ValueError("GyroDropoutLayer: iters_per_epoch and max_epoch are not set; "
                             "the GyroDropout algorithm sets them at FIT_START.")
        return max(1, int(self.iters_per_epoch * self.max_epoch / self.sigma) * self.tau)

    def _masks(self, round_: int, features: int, like: torch.Tensor) -> torch.Tensor:
        """The ``tau`` masks of pick number ``round_``: ``[tau, features]`` in x's dtype."""
        key = (round_, features, like.device, like.dtype)
        if key not in self._cache:
            seed = int(self.seed)
            pool = torch.rand(self.sigma, features,
                              generator=torch.Generator().manual_seed(seed)) > self.p
            picks = torch.randint(self.sigma, (self.tau,),
                                  generator=torch.Generator().manual_seed(seed + 1 + round_))
            self._cache = {key: pool[picks].to(device=like.device, dtype=like.dtype)}
        return self._cache[key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        if x.dim() < 2:
            raise ValueError(f"GyroDropoutLayer needs an input [batch, features, *], got "
                             f"shape {tuple(x.shape)}.")
        if self._step is None:
            self._step = int(self.training_step)
        masks = self._masks(self._step // self.iter_num, x.shape[1], x)
        batch = x.shape[0]
        rows = masks.repeat_interleave(math.ceil(batch / self.tau), dim=0)[:batch]
        self._step += 1
        self.training_step.fill_(self._step)
        return x * rows.view(*rows.shape, *([1] * (x.dim() - 2))) * (1 / (1 - self.p))

    def extra_repr(self) -> str:
        return f"p={self.p}, sigma={self.sigma}, tau={self.tau}"


def apply_gyro_dropout(model: nn.Module, iters_per_epoch: Optional[int],
                       max_epoch: Optional[int], p: float, sigma: int, tau: int) -> None:
    """Replace every ``torch.nn.Dropout`` in ``model`` (in place) with a
    :class:`GyroDropoutLayer` (Composer's function, same arguments); warns
    (:class:`~cadence.algorithms.warnings.NoEffectWarning`) when there is none.

    Raises:
        ValueError: bad ``p``, ``sigma`` or ``tau``.
    """
    _check(p, sigma, tau)
    policy = {nn.Dropout: partial(_replace, iters_per_epoch, max_epoch, p, sigma, tau)}
    replaced = module_surgery.replace_module_classes(module=model, policies=policy)
    if not replaced:
        warnings.warn(NoEffectWarning("GyroDropout: the model has no torch.nn.Dropout to "
                                      "replace."))
    log.info("GyroDropout replaced %d Dropout modules.", len(replaced))


def _replace(iters_per_epoch: Optional[int], max_epoch: Optional[int], p: float, sigma: int,
             tau: int, module: nn.Module, module_index: int) -> GyroDropoutLayer:
    return GyroDropoutLayer(iters_per_epoch, max_epoch, p, sigma, tau)


@algorithms.register("gyro_dropout")
class GyroDropout(Algorithm):
    """Replaces every ``torch.nn.Dropout`` with a :class:`GyroDropoutLayer` (Park et al.,
    MLSys 2022).

    The surgery runs at ``INIT`` (before the model is wrapped and before a checkpoint loads,
    so the layers' buffers load with it); at ``FIT_START`` each layer learns the run's
    length: ``iters_per_epoch`` = batches per epoch and ``max_epoch`` = epochs for a
    ``max_duration`` in epochs, or 1 "epoch" of ``max_duration`` batches (Composer reads
    ``max_duration``'s value as epochs whatever its unit, and does the surgery at
    ``FIT_START``).

    Args:
        p: fraction of features dropped, in [0, 1). Default 0.5.
        sigma: masks pre-selected. Default 256.
        tau: masks per batch, <= sigma. Default 16.

    Raises:
        ValueError: bad arguments (when constructed); at ``FIT_START``, a ``max_duration``
            in other units than epochs or batches, or an epoch duration without a sized
            train dataloader.

    Example (YAML)::

        algorithms:
          gyro_dropout: {p: 0.5, sigma: 256, tau: 16}
    """

    events = frozenset({Event.INIT, Event.FIT_START})

    def __init__(self, p: float = 0.5, sigma: int = 256, tau: int = 16) -> None:
        _check(p, sigma, tau)
        self.p, self.sigma, self.tau = float(p), int(sigma), int(tau)

    def __repr__(self) -> str:
        return f"GyroDropout(p={self.p}, sigma={self.sigma}, tau={self.tau})"

    def match(self, event: Event, state: State) -> bool:
        return event in self.events

    def apply(self, event: Event, state: State, logger: Any) -> None:
        if event == Event.INIT:
            apply_gyro_dropout(state.model, None, None, self.p, self.sigma, self.tau)
            return
        iters_per_epoch, max_epoch = self._length(state)
        for module in state.model.modules():
            if isinstance(module, GyroDropoutLayer):
                module.iters_per_epoch, module.max_epoch = iters_per_epoch, max_epoch

    @staticmethod
    def _length(state: State) -> tuple[int, int]:
        duration = state.max_duration
        if duration is None or duration.unit not in (TimeUnit.EPOCH, TimeUnit.BATCH):
            raise ValueError(f"GyroDropout needs max_duration in epochs or batches, got "
                             f"{duration}.")
        if duration.unit == TimeUnit.BATCH:
            return int(duration.value), 1
        if state.dataloader_len is None:
            raise ValueError("GyroDropout with max_duration in epochs needs a train "
                             "dataloader with a length.")
        return int(state.dataloader_len), int(duration.value)
