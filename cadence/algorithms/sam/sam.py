"""Sharpness-aware minimization: step with the gradient taken at the worst nearby weights.

Source: Foret et al., "Sharpness-Aware Minimization for Efficiently Improving
Generalization", ICLR 2021 (https://arxiv.org/abs/2010.01412); MosaicML Composer's ``SAM`` /
``SAMOptimizer`` (``composer/algorithms/sam/sam.py``), same arguments and defaults.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from cadence.registry import algorithms
from cadence.core import Algorithm, Event, State
from cadence.parallel.grad_norm import get_grad_norm

__all__ = ["SAM", "SAMOptimizer"]


class SAMOptimizer(torch.optim.Optimizer):
    """Wraps ``base_optimizer`` with SAM (Foret et al. 2021); see :class:`SAM`.

    Every ``interval``-th :meth:`step` takes two gradients through the closure the Trainer
    passes (:mod:`cadence.trainer.closures`):

    1. ``g = grad L(w)``, each rank's own (``closure(ddp_sync=False)``, DDP's ``no_sync``);
    2. ``e = rho * g / (||g||_2 + epsilon)`` (``||g||_2``: the norm of all gradients of the
       optimizer together), ``w <- w + e``;
    3. ``g' = grad L(w + e)`` (reduced over the ranks), back to ``w`` (its saved copy),
       then the base optimizer steps with ``g'``.

    The other steps are the base optimizer's, from one forward-backward. ``e`` has each
    parameter's shape and dtype; a copy of ``w`` (one more copy of the parameters) is kept
    during the step, and copied back.

    The parameter groups and the per-parameter state are the base optimizer's own objects,
    so a scheduler built on the base optimizer drives this one, and :meth:`state_dict` is the
    base optimizer's: a checkpoint resumes with or without SAM (Composer keeps ``e`` in the
    state and warns that such checkpoints do not resume).

    Args:
        base_optimizer: the optimizer that makes the update.
        rho: the radius of the neighbourhood, >= 0 (0: the base optimizer at twice the
            cost). Default 0.05.
        epsilon: added to the gradient norm so a zero gradient divides safely. Default 1e-12.
        interval: SAM runs on every ``interval``-th step (1: every step); > 0. Default 1.
        **kwargs: further defaults for the parameter groups (Composer's signature); a group
            that holds ``rho`` / ``epsilon`` keys uses its own.

    Raises:
        ValueError: ``rho < 0``, ``epsilon < 0`` or ``interval < 1``.
    """

    def __init__(self, base_optimizer: torch.optim.Optimizer, rho: float = 0.05,
                 epsilon: float = 1.0e-12, interval: int = 1, **kwargs: Any) -> None:
        _check(rho, epsilon, interval)
        self.base_optimizer = base_optimizer
        self.global_step = 0
        self.interval = int(interval)
        self._step_supports_amp_closure = True  # the Trainer steps it with a closure
        self._unperturbed: dict[torch.Tensor, torch.Tensor] = {}  # w, during a SAM step
        # rho / epsilon stay out of the (shared) groups, so the state dict is the base's
        super().__init__(base_optimizer.param_groups, dict(kwargs))
        self.defaults.update(rho=float(rho), epsilon=float(epsilon))
        self.state = base_optimizer.state  # one state: checkpoints are the base optimizer's

    @torch.no_grad()
    def _grad_norm(self) -> torch.Tensor:
        """The L2 norm of every gradient of every group, as one vector (0-d tensor; a
        sharded gradient's norm is over all its shards)."""
        return get_grad_norm(p for group in self.param_groups for p in group["params"])

    @torch.no_grad()
    def first_step(self) -> None:
        """``w <- w + rho * g / (||g|| + epsilon)``, remembering each ``w``."""
        grad_norm = self._grad_norm()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                rho = group.get("rho", self.defaults["rho"])  # a group may set its own
                scale = rho / (grad_norm.to(p.device) + group.get("epsilon",
                                                                 self.defaults["epsilon"]))
                self._unperturbed[p] = p.detach().clone()
                p.add_(p.grad * scale.to(p.grad.dtype))

    @torch.no_grad()
    def sub_e_w(self) -> None:
        """Back to ``w``, exactly: each perturbed parameter's saved value is copied back
        (``w + e - e`` would differ from ``w`` by rounding)."""
        for p, w in self._unperturbed.items():
            p.copy_(w)
        self._unperturbed.clear()

    @torch.no_grad()
    def second_step(self) -> None:
        """Back to ``w``, then the base optimizer's step with the gradient at ``w + e``."""
        self.sub_e_w()
        self.base_optimizer.step()

    @torch.no_grad()
    def step(self, closure: Optional[Callable[..., Any]] = None) -> Any:  # type: ignore[override]
        """One step (see the class docstring); returns the loss at ``w``, or ``None`` when
        a pass found inf/nan gradients (``amp_fp16``), and then the weights are unchanged.

        Without a closure (torch's distributed state-dict helpers create an empty state
        this way, with zero gradients and lr 0) the base optimizer steps alone.
        """
        if closure is None:
            self.global_step += 1
            return self.base_optimizer.step()
        closure = torch.enable_grad()(closure)
        if (self.global_step + 1) % self.interval == 0:
            loss = closure(ddp_sync=False)  # each rank's own gradient at w
            if loss is not None:
                self.first_step()
                if closure(loss_dict={}) is not None:  # at w + e; its loss is not logged
                    self.second_step()
                else:
                    self.sub_e_w()
        else:
            loss = closure()
            if loss is not None:
                self.base_optimizer.step()
        self.global_step += 1
        return loss


def _check(rho: float, epsilon: float, interval: int) -> None:
    if rho < 0:
        raise ValueError(f"rho must be >= 0 (the SAM neighbourhood radius), got {rho}.")
    if epsilon < 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}.")
    if int(interval) != interval or interval < 1:
        raise ValueError(f"interval must be an integer >= 1 (1: SAM on every step), "
                         f"got {interval!r}.")


@algorithms.register("sam")
class SAM(Algorithm):
    """Sharpness-aware minimization (Foret et al., ICLR 2021): wraps the run's optimizer in
    a :class:`SAMOptimizer` at ``AFTER_LOAD`` (after a checkpoint's optimizer state is in).

    A resumed run counts its steps from the checkpoint's batch, so with ``interval > 1``
    the SAM steps fall where they would have without the interruption.

    Each SAM step runs the batch's forward and backward twice (every microbatch, every
    ``BEFORE_FORWARD`` ... ``AFTER_BACKWARD`` event and ``AFTER_TRAIN_BATCH`` once per
    pass; ``BEFORE_TRAIN_BATCH`` once), so it costs about twice a plain step. Works with
    gradient accumulation and with ``amp_fp16``'s gradient scaler.

    Args:
        rho: neighbourhood radius, >= 0. Default 0.05.
        epsilon: added to the gradient norm. Default 1e-12.
        interval: SAM on every ``interval``-th step, the base optimizer alone on the others.
            Default 1.

    Raises:
        ValueError: as :class:`SAMOptimizer`, when constructed.

    Example (YAML)::

        algorithms:
          sam: {rho: 0.05, interval: 1}
    """

    events = frozenset({Event.AFTER_LOAD})

    def __init__(self, rho: float = 0.05, epsilon: float = 1.0e-12, interval: int = 1) -> None:
        _check(rho, epsilon, interval)
        self.rho = float(rho)
        self.epsilon = float(epsilon)
        self.interval = int(interval)

    def match(self, event: Event, state: State) -> bool:
        return event == Event.AFTER_LOAD

    def apply(self, event: Event, state: State, logger: Any) -> None:
        wrapped = []
        for opt in state.optimizers:
            if not isinstance(opt, SAMOptimizer):
                opt = SAMOptimizer(opt, rho=self.rho, epsilon=self.epsilon,
                                   interval=self.interval)
                # steps taken so far (a resumed run's): SAM steps keep their places
                opt.global_step = int(state.timestamp.batch)
            wrapped.append(opt)
        state.optimizers = wrapped
