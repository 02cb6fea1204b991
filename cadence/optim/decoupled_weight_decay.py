"""Optimizers with weight decay decoupled from the learning rate: :class:`DecoupledAdamW`
and :class:`DecoupledSGDW`.

On every step each weight is first multiplied by ``1 - weight_decay * lr / initial_lr``
(``initial_lr``: the group's learning rate when the optimizer was built), then the usual
Adam or SGD update is applied. The decay follows the learning-rate *schedule* but is not
multiplied by the learning rate itself, so ``weight_decay`` is the fraction of each weight
removed per step at the peak learning rate (``1e-5`` decays a weight by 1e-5 per step).
``torch.optim.AdamW`` instead multiplies by ``1 - lr * weight_decay``, tying the decay to
the size of the learning rate.

Source: Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019
(arXiv:1711.05101); MosaicML Composer's ``DecoupledAdamW`` / ``DecoupledSGDW``
(``composer/optim/decoupled_weight_decay.py``): same arguments, defaults and update.
Both register in :data:`cadence.registry.registry.optimizers` as ``decoupled_adamw`` and
``decoupled_sgdw``.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Iterable, Optional, Union

import torch

from cadence.registry import optimizers

__all__ = ["DecoupledAdamW", "DecoupledSGDW"]

log = logging.getLogger(__name__)

Params = Union[Iterable[torch.Tensor], Iterable[dict[str, Any]]]


def _warn_high_decay(name: str, weight_decay: float) -> None:
    if weight_decay >= 1e-3:
        log.warning("%s(weight_decay=%s): the weight decay is not scaled by the learning "
                    "rate, so every weight is multiplied by %s on every step. Values around "
                    "1e-5 are usual.", name, weight_decay, 1.0 - weight_decay)


def _decay_factor(group: dict[str, Any]) -> float:
    """``lr / initial_lr`` (1 when ``initial_lr`` is 0): where the schedule stands."""
    initial_lr = group.setdefault("initial_lr", group["lr"])
    return group["lr"] / initial_lr if initial_lr else 1.0


@optimizers.register("decoupled_sgdw")
class DecoupledSGDW(torch.optim.SGD):
    """SGD (with optional momentum) and decoupled weight decay.

    Per step, for each parameter ``p`` with gradient ``g``::

        buf = g (first step), else momentum * buf + (1 - dampening) * g
        d   = g + momentum * buf (nesterov) or buf (with momentum) or g (without)
        p  *= 1 - weight_decay * lr / initial_lr
        p  -= lr * d

    Args:
        params: parameters or parameter groups.
        lr: learning rate (required, as in Composer).
        momentum: momentum factor; default 0.
        dampening: dampening of the momentum; default 0.
        weight_decay: decoupled decay per step at ``lr == initial_lr``; default 0.
        nesterov: Nesterov momentum; default False.
    """

    def __init__(self, params: Params, lr: float, momentum: float = 0.0,
                 dampening: float = 0.0, weight_decay: float = 0.0,
                 nesterov: bool = False) -> None:
        _warn_high_decay("DecoupledSGDW", weight_decay)
        super().__init__(params, lr=lr, momentum=momentum, dampening=dampening,
                         weight_decay=weight_decay, nesterov=nesterov)
        for group in self.param_groups:
            group["initial_lr"] = group["lr"]

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:  # type: ignore[override]
        """One update of every parameter that has a gradient; returns ``closure()`` if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            decay = 1.0 - group["weight_decay"] * _decay_factor(group)
            for p in group["params"]:
                if p.grad is None:
                    continue
                d_p = p.grad
                if momentum != 0:
                    state = self.state[p]
                    buf = state.get("momentum_buffer")
                    if buf is None:
                        buf = state["momentum_buffer"] = torch.clone(d_p).detach()
                    else:
                        buf.mul_(momentum).add_(d_p, alpha=1 - group["dampening"])
                    d_p = d_p.add(buf, alpha=momentum) if group["nesterov"] else buf
                if decay != 1.0:
                    p.mul_(decay)
                p.add_(d_p, alpha=-lr)
        return loss


@optimizers.register("decoupled_adamw")
class DecoupledAdamW(torch.optim.AdamW):
    """Adam with decoupled weight decay.

    Per step ``t``, for each parameter ``p`` with gradient ``g``::

        p  *= 1 - weight_decay * lr / initial_lr
        m   = beta1 * m + (1 - beta1) * g
        v   = beta2 * v + (1 - beta2) * g**2          (amsgrad: v_max = max(v_max, v))
        p  -= lr / (1 - beta1**t) * m / (sqrt(v) / sqrt(1 - beta2**t) + eps)

    Defaults differ from ``torch.optim.AdamW`` as in Composer: ``betas=(0.9, 0.95)`` and
    ``weight_decay=1e-5`` (the decay is no longer multiplied by ``lr``).

    Args:
        params: parameters or parameter groups.
        lr: learning rate; default ``1e-3``.
        betas: moment decay rates; default ``(0.9, 0.95)``.
        eps: added to the denominator; default ``1e-8``.
        weight_decay: decoupled decay per step at ``lr == initial_lr``; default ``1e-5``.
        amsgrad: use the running maximum of ``v``; default False.

    The optimizer state (``step``, ``exp_avg``, ``exp_avg_sq``, ``max_exp_avg_sq``) uses
    ``torch.optim.AdamW``'s names, so checkpoints of either load into the other.
    """

    def __init__(self, params: Params, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8,
                 weight_decay: float = 1e-5, amsgrad: bool = False) -> None:
        _warn_high_decay("DecoupledAdamW", weight_decay)
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad)
        for group in self.param_groups:
            group["initial_lr"] = group["lr"]
        self.amsgrad = amsgrad

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:  # type: ignore[override]
        """One update of every parameter that has a gradient; returns ``closure()`` if given.

        Raises:
            RuntimeError: a sparse gradient.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, amsgrad = group["lr"], group["eps"], group["amsgrad"]
            decay = 1.0 - group["weight_decay"] * _decay_factor(group)
            for p in group["params"]:
                if p.grad is None or not p.requires_grad:
                    continue
                grad = p.grad
                if grad.is_sparse:
                    raise RuntimeError("DecoupledAdamW does not support sparse gradients.")
                state = self.state[p]
                if "step" not in state:
                    # on the host, as torch's AdamW keeps it: reading it costs no device sync
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    if amsgrad:
                        state["max_exp_avg_sq"] = torch.zeros_like(
                            p, memory_format=torch.preserve_format)
                state["step"] += 1
                step = float(state["step"].item())
                if decay != 1.0:
                    p.mul_(decay)
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                second = exp_avg_sq
                if amsgrad:
                    torch.maximum(state["max_exp_avg_sq"], exp_avg_sq,
                                  out=state["max_exp_avg_sq"])
                    second = state["max_exp_avg_sq"]
                denom = (second.sqrt() / math.sqrt(1 - beta2**step)).add_(eps)
                p.addcdiv_(exp_avg, denom, value=-lr / (1 - beta1**step))
        return loss

    def report_per_parameter_metrics(self, param: torch.Tensor, name: str,
                                     optimizer_metrics: dict[str, Any]) -> dict[str, Any]:
        """Add ``l2_norm/{moment,param,update,grad}/<name>`` for ``param`` (read by
        :class:`~cadence.callbacks.OptimizerMonitor`); nothing before its first step.

        ``update`` is the step the next update would take from the current moments, with
        the decay term, as Composer reports it.
        """
        group = self.param_groups[0]
        state = self.state.get(param)
        if not state or "step" not in state:
            return optimizer_metrics
        beta1, beta2 = group["betas"]
        step = float(state["step"].item())
        denom = (state["exp_avg_sq"].sqrt() / math.sqrt(1 - beta2**step)).add_(group["eps"])
        update = state["exp_avg"].div(denom).mul_(group["lr"] / (1 - beta1**step))
        update.add_(param, alpha=-group["weight_decay"] * _decay_factor(group))
        norm = torch.linalg.vector_norm
        optimizer_metrics[f"l2_norm/moment/{name}"] = norm(state["exp_avg"])
        optimizer_metrics[f"l2_norm/param/{name}"] = norm(param.detach())
        optimizer_metrics[f"l2_norm/update/{name}"] = norm(update)
        if param.grad is not None:
            optimizer_metrics[f"l2_norm/grad/{name}"] = norm(param.grad)
        return optimizer_metrics
