"""The :class:`ActivationMonitor` callback: statistics of every module's inputs and outputs
on one forward pass every ``interval``.

Source: MosaicML Composer's ``ActivationMonitor`` (``composer/callbacks/activation_monitor.py``).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence, Union

import torch

from cadence.registry import callbacks
from cadence.core import Callback, Time, TimeUnit

if TYPE_CHECKING:
    from cadence.core import State

__all__ = ["ActivationMonitor", "activation_stats", "compute_kurtosis"]


def compute_kurtosis(value: torch.Tensor) -> torch.Tensor:
    """The kurtosis ``E[(x-mu)^4] / Var(x)^2`` over the last dimension (population moments,
    not excess kurtosis: a Gaussian gives about 3), averaged over the other dimensions.
    ``value``: ``[..., hidden]``; returns a 0-d tensor."""
    diffs = value - value.mean(dim=-1, keepdim=True)
    fourth = diffs.pow(4).mean(dim=-1)
    var = diffs.pow(2).mean(dim=-1)
    return (fourth / var.pow(2)).mean()


def activation_stats(value: torch.Tensor) -> dict[str, float]:
    """``l2_norm``, ``average``, ``kurtosis`` and ``max`` of one activation ``[..., hidden]``:
    the L2 norm and the max over the last (hidden) dimension, averaged over the others; the
    mean of all elements; :func:`compute_kurtosis`. Empty for non-floating tensors."""
    if not (value.is_floating_point() or value.is_complex()) or value.numel() == 0:
        return {}
    value = value.detach()
    if value.dim() == 0:
        value = value.reshape(1)
    return {
        "l2_norm": torch.linalg.vector_norm(value, dim=-1).mean().item(),
        "average": value.mean().item(),
        "kurtosis": compute_kurtosis(value).item(),
        "max": value.max(dim=-1).values.mean().item(),
    }


@callbacks.register("activation_monitor")
class ActivationMonitor(Callback):
    """Every ``interval``, hooks every module of the model for one training forward (the
    first microbatch of the batch) and logs, for each floating tensor it takes or returns,
    :func:`activation_stats` under ``activations/<stat>/<module name>_input.<i>`` and
    ``..._output.<i>`` (``<stat>``: ``l2_norm``, ``average``, ``kurtosis``, ``max``; the
    module name as in ``model.named_modules()``, ``''`` for the model itself; ``i`` the
    argument's or output's position, dict outputs by their order). Tensors inside lists and
    tuples get ``_<j>`` added to the module name, as in Composer. The hooks are removed right
    after that forward.

    Cost: each logged value is read on the host (a device sync per statistic), so keep
    ``interval`` at 10 batches or more (a warning says so below that).

    Args:
        interval: how often: batches (``'25ba'``; an int means batches) or epochs. The
            forward of batch ``n`` (0-based count of batches done) is hooked when ``n`` is a
            multiple of it, so the first batch always is. Default ``'25ba'``.
        ignore_module_types: substrings of module names to skip (``['dropout', 'ln']``).
            Default none.
        only_log_wandb: send the statistics only to :class:`~cadence.loggers.WandBLogger`
            destinations when the run has any (there are many); else to every destination.
            Default True.

    Raises:
        ValueError: ``interval`` not positive batches or epochs.
    """

    def __init__(self, interval: Union[int, str, Time] = "25ba",
                 ignore_module_types: Optional[list[str]] = None,
                 only_log_wandb: bool = True) -> None:
        self.interval = Time.from_input(interval, TimeUnit.BATCH)
        if self.interval.unit not in (TimeUnit.BATCH, TimeUnit.EPOCH) or self.interval.value < 1:
            raise ValueError(f"ActivationMonitor interval must be a positive number of batches "
                             f"or epochs (e.g. '25ba'), got {interval!r}.")
        if self.interval.unit == TimeUnit.BATCH and self.interval.value < 10:
            warnings.warn(f"ActivationMonitor interval is {self.interval}: below 10 batches the "
                          f"host syncs it adds slow training down; raise it to at least 10ba.",
                          stacklevel=2)
        self.ignore_module_types = list(ignore_module_types or [])
        self.only_log_wandb = bool(only_log_wandb)
        self.handles: list[Any] = []
        self.module_names: dict[torch.nn.Module, str] = {}
        self.last_train_time_value_logged = -1

    def _due(self, state: State) -> Optional[int]:
        now = int(state.timestamp.get(self.interval.unit))
        due = now % int(self.interval.value) == 0 and now != self.last_train_time_value_logged
        return now if due else None

    def before_forward(self, state: State, logger: Any) -> None:
        if self._due(state) is None or self.handles:
            return
        if not self.module_names:
            self.module_names = {m: name for name, m in state.model.named_modules()}
        step = int(state.timestamp.batch)
        for module in state.model.modules():
            self.handles.append(module.register_forward_hook(
                lambda mod, args, out, _step=step: self._hook(logger, _step, mod, args, out)))

    def after_forward(self, state: State, logger: Any) -> None:
        del logger
        now = self._due(state)
        if now is not None:
            self.last_train_time_value_logged = now
            self.remove_forward_hooks()

    def remove_forward_hooks(self) -> None:
        """Remove the hooks (safe to call when there are none)."""
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def close(self) -> None:
        """Remove any hooks still attached. Safe to call twice."""
        self.remove_forward_hooks()

    def _hook(self, logger: Any, step: int, module: torch.nn.Module, args: Any,
              output: Any) -> None:
        name = self.module_names.get(module)
        if name is None or any(skip in name for skip in self.ignore_module_types):
            return
        metrics: dict[str, float] = {}
        for index, value in enumerate(_items(args)):
            self._add(metrics, name, f"_input.{index}", value)
        for index, value in enumerate(_items(output)):
            self._add(metrics, name, f"_output.{index}", value)
        if not metrics:
            return
        destinations = list(getattr(logger, "destinations", []))
        if self.only_log_wandb:
            from cadence.loggers.wandb_logger import WandBLogger

            wandb = [d for d in destinations if isinstance(d, WandBLogger)]
            if wandb:
                for destination in wandb:
                    destination.log_metrics(metrics, step)
                return
        logger.log_metrics(metrics, step)

    def _add(self, metrics: dict[str, float], name: str, suffix: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            for stat, number in activation_stats(value).items():
                metrics[f"activations/{stat}/{name}{suffix}"] = number
        elif isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
            for index, item in enumerate(value):
                self._add(metrics, f"{name}_{index}", suffix, item)


def _items(value: Any) -> list[Any]:
    """A hook's inputs or output as a list: a tensor is one item; a dict, its values."""
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, Mapping):
        return list(value.values())
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return list(value)
    return [value]
