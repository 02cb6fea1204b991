"""SAM: a Trainer step equals the hand-computed SAM update (with and without microbatches),
``interval`` alternates SAM and plain steps, bad arguments are refused, checkpoints hold the
base optimizer's state and resume exactly."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from cadence import Callback, Event, State, Trainer
from cadence.algorithms import SAM, SAMOptimizer
from tests.common.models import SimpleModel, make_dataloader

LR = 0.1


def _batches(num_batches: int = 3) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return list(make_dataloader(num_batches=num_batches, batch_size=4))


def _hand_sam(model: SimpleModel, batches: list[Any], rho: float, interval: int = 1,
              eps: float = 1e-12) -> SimpleModel:
    """SAM with plain SGD, written out: g at w, e = rho g/(|g|+eps), g' at w+e, w -= lr g'."""
    model = copy.deepcopy(model)
    params = list(model.parameters())

    def grads() -> list[torch.Tensor]:
        loss = F.cross_entropy(model.net(x), y)
        return list(torch.autograd.grad(loss, params))

    for step, (x, y) in enumerate(batches, start=1):
        g = grads()
        if step % interval == 0:
            norm = torch.linalg.vector_norm(torch.stack([t.norm() for t in g]))
            e = [rho * t / (norm + eps) for t in g]
            with torch.no_grad():
                for p, d in zip(params, e):
                    p.add_(d)
            g = grads()
            with torch.no_grad():
                for p, d in zip(params, e):
                    p.sub_(d)
        with torch.no_grad():
            for p, t in zip(params, g):
                p.sub_(LR * t)
    return model


def _fit(model: SimpleModel, algorithms: list[Any], num_batches: int = 3,
         **kwargs: Any) -> Trainer:
    trainer = Trainer(model=model, train_dataloader=make_dataloader(num_batches=num_batches,
                                                                    batch_size=4),
                      max_duration=f"{num_batches}ba", algorithms=algorithms,
                      optimizers=torch.optim.SGD(model.parameters(), lr=LR),
                      progress_bar=False, seed=0, device="cpu", **kwargs)
    trainer.fit()
    return trainer


@pytest.mark.parametrize("microbatch", [None, 2])
@pytest.mark.parametrize("interval", [1, 2])
def test_trainer_step_equals_hand_computed_sam(microbatch: Any, interval: int) -> None:
    torch.manual_seed(0)
    start = SimpleModel()
    expected = _hand_sam(start, _batches(), rho=0.3, interval=interval)
    plain = _hand_sam(start, _batches(), rho=0.0)
    trainer = _fit(copy.deepcopy(start), [SAM(rho=0.3, interval=interval)],
                   device_train_microbatch_size=microbatch)
    assert isinstance(trainer.state.optimizers[0], SAMOptimizer)
    for (name, got), want, base in zip(trainer.state.model.named_parameters(),
                                       expected.parameters(), plain.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=name)
        assert not torch.allclose(got, base, atol=1e-6), f"{name}: SAM changed nothing"


class _Passes(Callback):
    """Counts AFTER_TRAIN_BATCH per batch and records the logged loss."""

    def __init__(self) -> None:
        self.passes = 0
        self.losses: list[float] = []

    def after_train_batch(self, state: State, logger: Any) -> None:
        self.passes += 1

    def batch_end(self, state: State, logger: Any) -> None:
        self.losses.append(float(state.total_loss))


def test_two_passes_per_sam_step_and_loss_is_taken_at_w() -> None:
    torch.manual_seed(0)
    model = SimpleModel()
    first_x, first_y = _batches(4)[0]
    with torch.no_grad():
        loss_at_w = float(F.cross_entropy(model.net(first_x), first_y))
    passes = _Passes()
    _fit(model, [SAM(rho=0.5, interval=2)], num_batches=4, callbacks=[passes])
    assert passes.passes == 6  # steps 2 and 4 run twice
    assert passes.losses[0] == pytest.approx(loss_at_w, rel=1e-6)


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="rho"):
        SAM(rho=-0.1)
    with pytest.raises(ValueError, match="interval"):
        SAM(interval=0)
    opt = torch.optim.SGD(SimpleModel().parameters(), lr=LR)
    with pytest.raises(ValueError, match="rho"):
        SAMOptimizer(opt, rho=-1)
    assert SAM().events == frozenset({Event.AFTER_LOAD})


def test_checkpoint_holds_base_state_and_resumes_exactly(tmp_path: Path) -> None:
    def trainer(model: SimpleModel, **kwargs: Any) -> Trainer:
        return Trainer(model=model, train_dataloader=make_dataloader(num_batches=4),
                       max_duration="4ba", algorithms=[SAM(rho=0.2, interval=3)],
                       optimizers=torch.optim.Adam(model.parameters(), lr=1e-2),
                       progress_bar=False, seed=0, device="cpu", save_folder=str(tmp_path),
                       run_name="sam", save_interval="2ba", **kwargs)

    torch.manual_seed(0)
    start = SimpleModel()
    straight = trainer(copy.deepcopy(start))
    straight.fit()
    (checkpoint,) = tmp_path.glob("ep0-ba2*.pt")  # the name may carry the rank
    saved = torch.load(checkpoint, weights_only=False)
    saved = saved.get("state", saved)["optimizers"]  # Composer's layout nests "state"
    assert "param_groups" in str(saved) and "rho" not in str(saved)  # the base's state
    resumed = trainer(copy.deepcopy(start), load_path=str(checkpoint), save_overwrite=True)
    resumed.fit()
    for a, b in zip(straight.state.model.parameters(), resumed.state.model.parameters()):
        assert torch.equal(a, b)


class _InfOnPass(Callback):
    """Puts inf in one gradient on the chosen AFTER_BACKWARD calls (counted from 1)."""

    def __init__(self, passes: set[int]) -> None:
        self.passes, self.count = passes, 0

    def after_backward(self, state: State, logger: Any) -> None:
        self.count += 1
        if self.count in self.passes:
            next(state.model.parameters()).grad.view(-1)[0] = float("inf")


@pytest.mark.parametrize("bad_pass", [1, 2])  # at w, at w + e
def test_amp_fp16_scaler_skips_the_step_on_inf_and_restores_w(bad_pass: int) -> None:
    torch.manual_seed(0)
    model = SimpleModel()
    before = [p.detach().clone() for p in model.parameters()]
    trainer = _fit(model, [SAM(rho=0.2)], num_batches=1, precision="amp_fp16",
                   callbacks=[_InfOnPass({bad_pass})])
    assert trainer.grad_scaler is not None
    assert trainer.grad_scaler.get_scale() == 2.0 ** 15  # backed off once from 2 ** 16
    for a, b in zip(before, model.parameters()):
        assert torch.equal(a, b)


def test_amp_fp16_sam_matches_fp32_sam_on_finite_steps() -> None:
    torch.manual_seed(0)
    start = SimpleModel()
    fp32 = _fit(copy.deepcopy(start), [SAM(rho=0.3)])
    fp16 = _fit(copy.deepcopy(start), [SAM(rho=0.3)], precision="amp_fp16")
    assert fp16.grad_scaler is not None and fp16.grad_scaler.get_scale() == 2.0 ** 16
    for a, b in zip(fp32.state.model.parameters(), fp16.state.model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=5e-3)
        assert not torch.equal(a, b)  # fp16 really ran


def _hand_ddp_sam(model: SimpleModel, data: Any, rho: float, steps: int) -> SimpleModel:
    """SAM over 2 DDP ranks: each rank perturbs by its own gradient (no sync), then the
    gradients at the perturbed weights are averaged over the ranks."""
    from torch.utils.data.distributed import DistributedSampler

    model = copy.deepcopy(model)
    params = list(model.parameters())
    order = [list(DistributedSampler(data, num_replicas=2, rank=r, shuffle=False))
             for r in range(2)]

    def grads(x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        return list(torch.autograd.grad(F.cross_entropy(model.net(x), y), params))

    for step in range(steps):
        total = [torch.zeros_like(p) for p in params]
        for rank in range(2):
            idx = order[rank][4 * step:4 * step + 4]
            x, y = data.tensors[0][idx], data.tensors[1][idx]
            g = grads(x, y)
            norm = torch.linalg.vector_norm(torch.stack([t.norm() for t in g]))
            saved = [p.detach().clone() for p in params]
            with torch.no_grad():
                for p, t in zip(params, g):
                    p.add_(rho * t / (norm + 1e-12))
            for acc, t in zip(total, grads(x, y)):
                acc.add_(t / 2)
            with torch.no_grad():
                for p, w in zip(params, saved):
                    p.copy_(w)
        with torch.no_grad():
            for p, t in zip(params, total):
                p.sub_(LR * t)
    return model


@pytest.mark.slow
@pytest.mark.world_size(2)
def test_ddp_perturbs_with_each_ranks_own_gradient() -> None:
    from torch.utils.data import DataLoader

    from cadence import dist

    torch.manual_seed(0)
    start = SimpleModel()
    data = make_dataloader(num_batches=6, batch_size=4).dataset  # 24 samples, 3 steps of 8
    expected = _hand_ddp_sam(start, data, rho=0.5, steps=3)
    model = copy.deepcopy(start)
    loader = DataLoader(data, batch_size=4, sampler=dist.get_sampler(data, shuffle=False))
    trainer = Trainer(model=model, train_dataloader=loader, max_duration="3ba",
                      algorithms=[SAM(rho=0.5)],
                      optimizers=torch.optim.SGD(model.parameters(), lr=LR),
                      progress_bar=False, seed=0, device="cpu")
    trainer.fit()
    for got, want in zip(model.parameters(), expected.parameters()):
        torch.testing.assert_close(got.detach(), want, rtol=1e-5, atol=1e-6)
