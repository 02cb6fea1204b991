"""StochasticDepth: residual blocks skipped at random while training.

Source: Huang, Sun, Liu, Sedra and Weinberger, "Deep Networks with Stochastic Depth", ECCV
2016 (https://arxiv.org/abs/1603.09382) for the block mode; the per-sample "drop connect" of
EfficientNet (Tan and Le 2019, https://github.com/tensorflow/tpu) for the sample mode;
MosaicML Composer's ``StochasticDepth`` / ``apply_stochastic_depth``
(``composer/algorithms/stochastic_depth/``): same names, arguments, defaults, events
(``INIT``; ``BATCH_START`` with ``drop_warmup``) and eval-time scaling.

Composer imports torchvision's ``Bottleneck``; cadence cannot import torchvision, so a
ResNet bottleneck is recognised by its structure: a module whose class is named
``Bottleneck`` with torchvision's attributes ``conv1..conv3``, ``bn1..bn3``, ``relu`` and
``downsample`` (torchvision's ResNet-50/101/152 blocks, and any block written like them).
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Union

import torch
from torch import nn

from cadence.registry import algorithms
from cadence.core import Algorithm, Event, State
from cadence.core.time import Time, TimeUnit
from cadence.utils import module_surgery

__all__ = ["StochasticBottleneck", "StochasticDepth", "apply_stochastic_depth",
           "is_resnet_bottleneck"]

log = logging.getLogger(__name__)

_VALID_LAYER_NAMES = ("ResNetBottleneck",)
_VALID_METHODS = ("block", "sample")
_VALID_DISTRIBUTIONS = ("uniform", "linear")
_BLOCK_PARTS = ("conv1", "bn1", "conv2", "bn2", "conv3", "bn3", "relu", "downsample")


def is_resnet_bottleneck(module: nn.Module) -> bool:
    """Whether ``module`` is a ResNet bottleneck block as torchvision writes it: class name
    ``Bottleneck`` and attributes ``conv1, bn1, conv2, bn2, conv3, bn3, relu, downsample``
    (``downsample`` may be None)."""
    return (type(module).__name__ == "Bottleneck"
            and all(hasattr(module, part) for part in _BLOCK_PARTS))


class StochasticBottleneck(nn.Module):
    """A ResNet bottleneck whose residual branch is dropped at random in training:
    ``[N, C_in, H, W] -> [N, C_out, H / stride, W / stride]``, as the block it wraps.

    It holds the original block's submodules under the same names (``conv1`` ... ``bn3``,
    ``relu``, ``downsample``), so parameters, optimizers and ``state_dict`` keys are
    unchanged. With ``branch = bn3(conv3(...conv1(x)))`` and ``shortcut = downsample(x)``
    (or ``x``), ``p = drop_rate``:

    - ``"block"`` (Huang et al. 2016), training: with probability ``p`` the branch is skipped
      for the whole batch and the output is ``relu(shortcut)`` (just ``x`` without
      ``downsample``); otherwise ``relu(branch + shortcut)``. One draw per forward, from
      torch's global CPU generator (so a checkpoint's RNG state makes resumes exact). Each
      rank draws its own (as in Composer); with several ranks, a dropped branch's
      parameters still get zero gradients, so DDP and FSDP2 reduce every parameter on every
      rank (in one process they get none).
    - ``"sample"`` (EfficientNet's drop connect), training: each sample's branch is zeroed
      with probability ``p``: ``relu(branch * mask[N, 1, 1, 1] + shortcut)``.
    - eval, both modes: ``relu((1 - p) * branch + shortcut)``, the expected training output.

    Args:
        block: the bottleneck to wrap (see :func:`is_resnet_bottleneck`).
        drop_rate: ``p`` in ``[0, 1]``.
        stochastic_method: ``"block"`` or ``"sample"``.
    """

    def __init__(self, block: nn.Module, drop_rate: float, stochastic_method: str = "block"
                 ) -> None:
        super().__init__()
        for part in _BLOCK_PARTS:
            setattr(self, part, getattr(block, part))
        self.stride = getattr(block, "stride", 1)
        self.expansion = getattr(block, "expansion", 4)
        self.drop_rate = float(drop_rate)
        self.stochastic_method = stochastic_method

    def extra_repr(self) -> str:
        return f"drop_rate={self.drop_rate:.4g}, stochastic_method={self.stochastic_method!r}"

    def _branch(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.bn3(self.conv3(out))

    def _shortcut(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.downsample is None else self.downsample(x)

    def _zero_from_branch(self) -> torch.Tensor:
        """0, computed from every branch parameter: with several ranks, a block dropped on
        one rank only must still join the gradient reduction (DDP, FSDP2) with zero
        gradients, as a block's parameters do on a rank that did not use them."""
        params = [p for name in _BLOCK_PARTS[:6] for p in getattr(self, name).parameters()]
        total = params[0].sum()
        for param in params[1:]:
            total = total + param.sum()
        return total * 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keep = 1.0 - self.drop_rate
        if not self.training:
            return self.relu(self._branch(x) * keep + self._shortcut(x))
        if self.stochastic_method == "block":
            if float(torch.rand(())) >= keep:  # dropped: the branch is not computed
                out = x if self.downsample is None else self.relu(self.downsample(x))
                return out + self._zero_from_branch() if _several_ranks() else out
            return self.relu(self._branch(x) + self._shortcut(x))
        branch = self._branch(x)
        if self.drop_rate > 0:
            mask = (torch.rand((x.shape[0],) + (1,) * (branch.ndim - 1)) < keep)
            branch = branch * mask.to(device=branch.device, dtype=branch.dtype)
        return self.relu(branch + self._shortcut(x))


def _several_ranks() -> bool:
    return (torch.distributed.is_available() and torch.distributed.is_initialized()
            and torch.distributed.get_world_size() > 1)


def _layer_rate(drop_rate: float, drop_distribution: str, index: int, count: int) -> float:
    """The ``index``-th (0-based) of ``count`` blocks' rate: ``drop_rate`` (uniform) or
    ``drop_rate * (index + 1) / count`` (linear: deeper blocks drop more)."""
    if drop_distribution == "linear":
        return drop_rate * (index + 1) / count
    return drop_rate


def _validate(target_layer_name: str, stochastic_method: str, drop_rate: float,
              drop_distribution: str) -> None:
    if target_layer_name not in _VALID_LAYER_NAMES:
        raise ValueError(f"target_layer_name {target_layer_name!r} is not supported; use one "
                         f"of {list(_VALID_LAYER_NAMES)}.")
    if stochastic_method not in _VALID_METHODS:
        raise ValueError(f"stochastic_method {stochastic_method!r} is not one of "
                         f"{list(_VALID_METHODS)}.")
    if not 0.0 <= drop_rate <= 1.0:
        raise ValueError(f"drop_rate must be in [0, 1], got {drop_rate}.")
    if drop_distribution not in _VALID_DISTRIBUTIONS:
        raise ValueError(f"drop_distribution {drop_distribution!r} is not one of "
                         f"{list(_VALID_DISTRIBUTIONS)}.")


def apply_stochastic_depth(model: nn.Module, target_layer_name: str,
                           stochastic_method: str = "block", drop_rate: float = 0.2,
                           drop_distribution: str = "linear") -> nn.Module:
    """Make every ResNet bottleneck of ``model`` stochastic, in place (Huang et al. 2016):
    each becomes a :class:`StochasticBottleneck` around it.

    Args:
        model: the model to modify (not yet wrapped or sharded).
        target_layer_name: the kind of block; only ``"ResNetBottleneck"`` (see
            :func:`is_resnet_bottleneck`).
        stochastic_method: ``"block"`` drops whole blocks, ``"sample"`` drops the branch for
            single samples; default ``"block"``.
        drop_rate: the drop probability in ``[0, 1]``; default 0.2.
        drop_distribution: ``"uniform"`` (every block ``drop_rate``) or ``"linear"`` (the
            ``i``-th of ``L`` blocks, counting from 1 in registration order,
            ``drop_rate * i / L``); default ``"linear"``.

    Returns:
        ``model``.

    Raises:
        ValueError: an argument out of its range (named in the message).
        TypeError: ``model`` is already parallelized (DDP / FSDP).
    """
    _validate(target_layer_name, stochastic_method, drop_rate, drop_distribution)
    count = sum(1 for m in model.modules() if m is not model and is_resnet_bottleneck(m))

    def make_stochastic(module: nn.Module, module_index: int) -> Optional[nn.Module]:
        del module_index  # counts every module visited, not just bottlenecks
        if not is_resnet_bottleneck(module):
            return None
        rate = _layer_rate(drop_rate, drop_distribution, len(made), count)
        made.append(module)
        return StochasticBottleneck(module, rate, stochastic_method)

    made: list[nn.Module] = []
    module_surgery.replace_module_classes(model, {nn.Module: make_stochastic})
    return model


def _set_drop_rates(model: nn.Module, drop_rate: float, drop_distribution: str) -> None:
    blocks = [m for m in model.modules() if isinstance(m, StochasticBottleneck)]
    for index, block in enumerate(blocks):
        block.drop_rate = _layer_rate(drop_rate, drop_distribution, index, len(blocks))


@algorithms.register("stochastic_depth")
class StochasticDepth(Algorithm):
    """Stochastic depth (Huang et al. 2016) for ResNet bottlenecks: blocks (or, per sample,
    their residual branches) dropped at random in training, scaled by the keep probability
    in eval; ``[N, C, H, W]`` images, logits unchanged in shape. Surgery at ``Event.INIT``
    (:func:`apply_stochastic_depth`); with ``drop_warmup``, the rate ramps linearly from 0 at
    each ``Event.BATCH_START`` until the warmup ends.

    Args:
        target_layer_name: ``"ResNetBottleneck"`` (required, as in Composer).
        stochastic_method: ``"block"`` (default) or ``"sample"``.
        drop_rate: the (deepest block's, with ``linear``) drop probability in ``[0, 1]``;
            default 0.2.
        drop_distribution: ``"linear"`` (default) or ``"uniform"`` over depth.
        drop_warmup: how long the rate ramps up: a float fraction of the run in ``[0, 1]``,
            a :class:`~cadence.Time` or a time string (``"0.1dur"``, ``"2ep"``,
            ``"100ba"``); default 0.0 (no warmup). Only with ``stochastic_method="block"``.

    Raises:
        ValueError: an unknown name, method or distribution, ``drop_rate`` outside
            ``[0, 1]``, a bad ``drop_warmup``, or a warmup with ``"sample"``.

    Logs ``stochastic_depth/num_stochastic_layers`` at INIT and
    ``stochastic_depth/drop_rate`` during the warmup. Its ``state_dict`` holds the number of
    stochastic blocks and the current rate; the drops themselves come from torch's global
    RNG, which checkpoints restore.

    Example (YAML)::

        algorithms:
          stochastic_depth: {target_layer_name: ResNetBottleneck, drop_rate: 0.1,
                             drop_warmup: 0.2dur}
    """

    events = frozenset({Event.INIT, Event.BATCH_START})

    def __init__(self, target_layer_name: str, stochastic_method: str = "block",
                 drop_rate: float = 0.2, drop_distribution: str = "linear",
                 drop_warmup: Union[float, Time, str] = 0.0) -> None:
        _validate(target_layer_name, stochastic_method, drop_rate, drop_distribution)
        self.drop_warmup = _parse_warmup(drop_warmup)
        if stochastic_method == "sample" and self.drop_warmup.value != 0:
            raise ValueError(f"drop_warmup={drop_warmup!r} needs stochastic_method='block' "
                             f"(as in Composer); set drop_warmup=0 for 'sample'.")
        if drop_rate == 0.0:
            log.warning("StochasticDepth with drop_rate=0 drops nothing.")
        self.target_layer_name = target_layer_name
        self.stochastic_method = stochastic_method
        self.drop_rate = float(drop_rate)
        self.drop_distribution = drop_distribution
        self.num_stochastic_layers = 0
        self.current_drop_rate = self.drop_rate

    def __repr__(self) -> str:
        return (f"StochasticDepth(target_layer_name={self.target_layer_name!r}, "
                f"stochastic_method={self.stochastic_method!r}, drop_rate={self.drop_rate}, "
                f"drop_distribution={self.drop_distribution!r}, "
                f"drop_warmup={self.drop_warmup.to_timestring()!r})")

    @property
    def find_unused_parameters(self) -> bool:
        """Block mode skips whole blocks, whose parameters then get no gradient (DDP must
        look for unused parameters)."""
        return self.stochastic_method == "block"

    @staticmethod
    def required_on_load() -> bool:
        """The checkpoint's model has this surgery: a resumed run must apply it too."""
        return True

    def match(self, event: Event, state: State) -> bool:
        return event == Event.INIT or (event == Event.BATCH_START
                                       and self.drop_warmup.value > 0)

    def apply(self, event: Event, state: State, logger: Any) -> None:
        if event == Event.INIT:
            apply_stochastic_depth(state.model, self.target_layer_name, self.stochastic_method,
                                   self.drop_rate, self.drop_distribution)
            self.num_stochastic_layers = module_surgery.count_module_instances(
                state.model, StochasticBottleneck)
            if self.num_stochastic_layers == 0:
                log.warning("StochasticDepth found no %s in %s: it does nothing.",
                            self.target_layer_name, type(state.model).__name__)
            logger.log_metrics(
                {"stochastic_depth/num_stochastic_layers": self.num_stochastic_layers})
            return
        if not self.num_stochastic_layers:
            return
        progress = _warmup_progress(state, self.drop_warmup)
        self.current_drop_rate = self.drop_rate * progress
        _set_drop_rates(state.model, self.current_drop_rate, self.drop_distribution)
        logger.log_metrics({"stochastic_depth/drop_rate": self.current_drop_rate})

    def state_dict(self) -> dict[str, Any]:
        return {"num_stochastic_layers": self.num_stochastic_layers,
                "current_drop_rate": self.current_drop_rate}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.num_stochastic_layers = int(state["num_stochastic_layers"])
        self.current_drop_rate = float(state["current_drop_rate"])


def _parse_warmup(drop_warmup: Union[float, int, Time, str]) -> Time:
    if isinstance(drop_warmup, str):
        try:
            warmup = Time.from_timestring(drop_warmup)
        except (ValueError, TypeError) as error:
            raise ValueError(f"drop_warmup {drop_warmup!r} is not a time string ('0.1dur', "
                             f"'2ep', '100ba'): {error}") from None
    elif isinstance(drop_warmup, Time):
        warmup = drop_warmup
    elif isinstance(drop_warmup, (int, float)) and not isinstance(drop_warmup, bool):
        warmup = Time(float(drop_warmup), TimeUnit.DURATION)
    else:
        raise ValueError(f"drop_warmup must be a float, Time or time string, got "
                         f"{type(drop_warmup).__name__}.")
    if warmup.value < 0 or (warmup.unit == TimeUnit.DURATION and warmup.value > 1):
        raise ValueError(f"drop_warmup must be >= 0 (and <= 1 as a fraction of the run), got "
                         f"{drop_warmup!r}.")
    return warmup


def _warmup_progress(state: State, warmup: Time) -> float:
    """How far the run is through ``warmup``, in ``[0, 1]``."""
    if warmup.unit == TimeUnit.DURATION:
        elapsed = state.get_elapsed_duration()
        done = 1.0 if elapsed is None else float(elapsed.value)
    else:
        done = float(state.timestamp.get(warmup.unit).value)
    return min(done / float(warmup.value), 1.0)
