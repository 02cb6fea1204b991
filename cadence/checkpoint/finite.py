"""Finite checkpoints: a state with NaN or inf never becomes the newest checkpoint.

Before each save, :class:`~cadence.callbacks.checkpoint_saver.CheckpointSaver` asks
:func:`nonfinite_state` whether the loss of the batch just trained and every floating-point
parameter and buffer the checkpoint would hold are finite. A non-finite state is written
aside as ``<name>.nonfinite`` (for debugging; never listed, pointed at or resumed from:
:func:`~cadence.checkpoint.files.is_aside`), the ``latest`` pointer stays on the last finite
checkpoint, and the run stops with :class:`NonFiniteStateError` naming the first batch whose
loss was not finite. ``save_allow_nonfinite=True`` (run file: ``save_allow_nonfinite:
true``) opts out: no check, every state is saved as before.

Cost: one sum per tensor (fp32 accumulation; NaN and inf propagate into a sum) and one host
sync for the whole model (and, with several ranks, one all-reduce of two numbers); only when
a sum is not finite are those tensors checked again exactly (max-abs), so large finite values
that overflow a sum are not taken for NaN. Measured in ``tests/checkpoint/test_nonfinite.py``:
about the cost of summing every tensor once. The first non-finite loss is tracked on the device
(:class:`FirstNonFinite`: a few element-wise kernels per batch, no host sync), so naming it
costs no synchronisation during training.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from cadence.utils import dist
from cadence.utils.dtensor import local_tensor

__all__ = ["FirstNonFinite", "NonFiniteStateError", "finite_flags", "nonfinite_state"]


class NonFiniteStateError(RuntimeError):
    """A save found NaN or inf in the loss or the weights; the message names the first
    non-finite batch, the checkpoint written aside, and the opt-out."""


class FirstNonFinite:
    """The first batch (1-based step) whose loss was NaN or inf, tracked on the device: no
    host sync per batch. Not saved in checkpoints (a resumed run starts finite)."""

    def __init__(self) -> None:
        self._first: Optional[torch.Tensor] = None

    def observe(self, loss: Optional[torch.Tensor], step: int) -> None:
        """Note ``loss`` (the batch's, any shape) of step ``step``."""
        if loss is None:
            return
        loss = loss.detach()
        bad = ~torch.isfinite(loss).all()
        if self._first is None:
            self._first = torch.zeros((), dtype=torch.long, device=loss.device)
        self._first = torch.where(bad & (self._first == 0), step, self._first)

    def first(self) -> Optional[int]:
        """The step, or None when every observed loss was finite (a host sync)."""
        return None if self._first is None or int(self._first) == 0 else int(self._first)

    def reset(self) -> None:
        self._first = None


def finite_flags(tensors: list[torch.Tensor], exact: bool = False) -> torch.Tensor:
    """Per tensor, whether its sum is finite (a bool tensor on the first tensor's device; no
    host sync): one sum per tensor, accumulated in fp32. NaN and inf propagate into a sum, so
    a finite sum means a finite tensor; a sum that is not finite means NaN/inf, or finite
    values that overflowed the sum: ``exact`` checks by max-abs instead, which cannot
    overflow (the second look at the tensors a first pass flagged)."""
    if not tensors:
        return torch.ones(0, dtype=torch.bool)
    device = tensors[0].device
    if exact:
        values = [torch.linalg.vector_norm(t, math.inf).float().to(device) for t in tensors]
    else:
        values = [t.sum(dtype=torch.float32).to(device) for t in tensors]
    return torch.isfinite(torch.stack(values))


def _checked(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The floating-point parameters and buffers of ``model`` (this rank's shards), by name."""
    named = [*model.named_parameters(), *model.named_buffers()]
    return [(name, local_tensor(t).detach()) for name, t in named
            if t is not None and t.is_floating_point() and local_tensor(t).numel() > 0]


def nonfinite_state(model: torch.nn.Module, loss: Optional[torch.Tensor]) -> Optional[str]:
    """What is not finite in the state about to be saved (call on every rank: with several,
    one all-reduce): the batch's ``loss`` and the model's parameters and buffers. None when
    all are finite.

    Returns:
        e.g. ``"the loss of this batch is nan, and 4 of 4 parameters and buffers hold NaN or
        inf (net.0.weight, ...)"``; None when everything is finite.
    """
    named = _checked(model)
    flags = finite_flags([t for _, t in named])
    device = flags.device if flags.numel() else (loss.device if loss is not None else "cpu")
    bad_params = (~flags).sum().float().to(device) if flags.numel() else torch.zeros(
        (), device=device)
    bad_loss = (torch.zeros((), device=device) if loss is None
                else (~torch.isfinite(loss.detach()).all()).float().to(device))
    summary = torch.stack([bad_params, bad_loss])
    if dist.get_world_size() > 1:
        dist.all_reduce(summary, "sum")
    n_params, n_loss = summary.tolist()  # the one host sync
    if n_params:  # a sum was not finite: look again, exactly, at those tensors only
        flagged = [i for i, ok in enumerate(flags.tolist()) if not ok]
        exact = finite_flags([named[i][1] for i in flagged], exact=True)
        for i, ok in zip(flagged, exact.tolist()):
            flags[i] = ok
        recount = (~flags).sum().float().reshape(1)
        if dist.get_world_size() > 1:
            dist.all_reduce(recount, "sum")
        n_params = recount.item()
    if n_params == 0 and n_loss == 0:
        return None
    parts = []
    if n_loss:
        value = loss.detach().float().sum().item() if loss is not None else float("nan")
        parts.append(f"the loss of this batch is {value}" if dist.get_world_size() == 1 else
                     f"the loss of this batch is not finite on {int(n_loss)} rank(s)")
    if n_params:
        names = [name for (name, _), ok in zip(named, flags.tolist()) if not ok]
        if dist.get_world_size() > 1:
            names = sorted({n for rank_names in dist.all_gather_object(names)
                            for n in rank_names})
        shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10
                                         else "")
        parts.append(f"{len(names)} of {len(named)} parameters and buffers hold NaN or inf "
                     f"({shown})")
    return ", and ".join(parts)
