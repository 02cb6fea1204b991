"""DecoupledAdamW / DecoupledSGDW: Composer's signatures and defaults, and the update checked
by hand and against torch's optimizers."""

from __future__ import annotations

import copy
import inspect
import math

import pytest
import torch

from cadence.registry import registry
from cadence.optim.decoupled_weight_decay import DecoupledAdamW, DecoupledSGDW


def _param(value: float) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.tensor([value]))


def test_signatures_and_defaults_match_composer() -> None:
    adamw = inspect.signature(DecoupledAdamW).parameters
    assert list(adamw) == ["params", "lr", "betas", "eps", "weight_decay", "amsgrad"]
    assert (adamw["lr"].default, adamw["betas"].default, adamw["eps"].default,
            adamw["weight_decay"].default, adamw["amsgrad"].default) == (
        1e-3, (0.9, 0.95), 1e-8, 1e-5, False)
    sgdw = inspect.signature(DecoupledSGDW).parameters
    assert list(sgdw) == ["params", "lr", "momentum", "dampening", "weight_decay", "nesterov"]
    assert sgdw["lr"].default is inspect.Parameter.empty  # required, as in Composer
    opt = DecoupledAdamW([_param(1.0)], lr=0.1)
    assert opt.param_groups[0]["initial_lr"] == 0.1
    assert isinstance(opt, torch.optim.AdamW) and isinstance(DecoupledSGDW([_param(1.0)], lr=1),
                                                             torch.optim.SGD)


def test_registered_for_yaml() -> None:
    assert registry.optimizers.get("decoupled_adamw") is DecoupledAdamW
    assert registry.optimizers.get("decoupled_sgdw") is DecoupledSGDW


def test_adamw_first_step_by_hand() -> None:
    p = _param(1.0)
    opt = DecoupledAdamW([p], lr=0.1, weight_decay=0.01)
    p.grad = torch.tensor([0.5])
    opt.step()
    # decay by 1 - 0.01 * (lr / initial_lr) = 0.99; m = 0.05, v = 0.0125;
    # step = lr / (1 - 0.9) * m / (sqrt(v) / sqrt(1 - 0.95) + eps) = 0.1
    assert p.item() == pytest.approx(0.99 - 0.1 * 0.05 / 0.1 / (0.5 + 1e-8), rel=1e-6)
    assert opt.state[p]["step"].item() == 1.0


def test_decay_follows_the_schedule_not_the_learning_rate() -> None:
    p = _param(2.0)
    opt = DecoupledSGDW([p], lr=0.5, weight_decay=0.1)
    p.grad = torch.zeros(1)
    opt.step()
    assert p.item() == pytest.approx(2.0 * 0.9)  # lr == initial_lr: decay by weight_decay
    opt.param_groups[0]["lr"] = 0.25  # a scheduler halved the lr
    opt.step()
    assert p.item() == pytest.approx(2.0 * 0.9 * (1 - 0.1 * 0.5))


def test_adamw_equals_torch_adamw_at_constant_lr() -> None:
    """torch's AdamW decays by lr * wd; at constant lr, wd_torch = wd / lr is the same update."""
    torch.manual_seed(0)
    init = torch.randn(5)
    ours, theirs = torch.nn.Parameter(init.clone()), torch.nn.Parameter(init.clone())
    lr, wd = 0.01, 1e-3
    a = DecoupledAdamW([ours], lr=lr, weight_decay=wd, betas=(0.9, 0.999))
    b = torch.optim.AdamW([theirs], lr=lr, weight_decay=wd / lr, betas=(0.9, 0.999))
    for _ in range(5):
        grad = torch.randn(5)
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        a.step()
        b.step()
    torch.testing.assert_close(ours.detach(), theirs.detach(), rtol=1e-5, atol=1e-7)


def test_sgdw_momentum_by_hand_and_nesterov() -> None:
    p = _param(1.0)
    opt = DecoupledSGDW([p], lr=0.1, momentum=0.9, weight_decay=0.01)
    p.grad = torch.tensor([1.0])
    opt.step()  # buf = 1; p = 0.99 - 0.1
    assert p.item() == pytest.approx(0.89)
    p.grad = torch.tensor([1.0])
    opt.step()  # buf = 0.9 + 1 = 1.9; p = 0.89 * 0.99 - 0.19
    assert p.item() == pytest.approx(0.89 * 0.99 - 0.19)
    q = _param(1.0)
    nesterov = DecoupledSGDW([q], lr=0.1, momentum=0.5, nesterov=True)
    q.grad = torch.tensor([1.0])
    nesterov.step()  # d = g + 0.5 * buf = 1.5
    assert q.item() == pytest.approx(1.0 - 0.15)


def test_state_dict_round_trip_continues_identically() -> None:
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(3))
    opt = DecoupledAdamW([p], lr=0.01, amsgrad=True)
    grads = [torch.randn(3) for _ in range(4)]
    for g in grads[:2]:
        p.grad = g.clone()
        opt.step()
    q = torch.nn.Parameter(p.detach().clone())
    restored = DecoupledAdamW([q], lr=0.01, amsgrad=True)
    restored.load_state_dict(copy.deepcopy(opt.state_dict()))  # not shared moments
    for g in grads[2:]:
        p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        restored.step()
    assert torch.equal(p, q)
    assert not math.isnan(p.sum().item())
