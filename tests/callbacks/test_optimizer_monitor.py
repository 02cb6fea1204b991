from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, TensorDataset

from cadence import Callback, State, Trainer
from cadence.callbacks import OptimizerMonitor
from cadence.utils import dist
from cadence.loggers import InMemoryLogger
from tests.common.models import SimpleModel, make_dataloader


class ReferenceNorms(Callback):
    """Records, per step, torch's own total gradient norm at AFTER_TRAIN_BATCH and the
    parameter norm at BATCH_END."""

    def __init__(self) -> None:
        self.grad: dict[int, float] = {}
        self.param: dict[int, float] = {}

    def after_train_batch(self, state: State, logger: Any) -> None:
        params = [p for p in state.model.parameters() if p.grad is not None]
        # max_norm=inf: returns the total norm and leaves the gradients unchanged.
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm=math.inf)
        self.grad[int(state.timestamp.batch) + 1] = float(norm)

    def batch_end(self, state: State, logger: Any) -> None:
        squares = sum(float(p.detach().pow(2).sum()) for p in state.model.parameters())
        self.param[int(state.timestamp.batch)] = math.sqrt(squares)


def test_grad_norm_matches_clip_grad_norm() -> None:
    memory, reference = InMemoryLogger(), ReferenceNorms()
    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=5),
                      max_duration="5ba", seed=0, progress_bar=False,
                      callbacks=[OptimizerMonitor(batch_log_interval=2, log_per_layer=False),
                                 reference],
                      loggers=[memory])
    trainer.fit()
    trainer.close()
    steps, grads = memory.steps_and_values("l2_norm/grad/global")
    assert steps == [2, 4]  # multiples of batch_log_interval, as in Composer
    assert grads == pytest.approx([reference.grad[s] for s in steps], rel=1e-6)
    steps, params = memory.steps_and_values("l2_norm/param/global")
    assert steps == [2, 4]
    assert params == pytest.approx([reference.param[s] for s in steps], rel=1e-6)
    assert not any(key.startswith("l2_norm/grad/net") for key in memory.data)


def test_per_layer_norms_add_up_to_the_global_norm() -> None:
    memory = InMemoryLogger()
    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=1),
                      max_duration="1ba", seed=0, progress_bar=False,
                      callbacks=[OptimizerMonitor(batch_log_interval=1, log_per_layer=True)],
                      loggers=[memory])
    trainer.fit()
    values = memory.most_recent_values
    names = [name for name, _ in SimpleModel().named_parameters()]
    for kind in ("grad", "param"):
        layers = [values[f"l2_norm/{kind}/{name}"] for name in names]
        assert math.sqrt(sum(v * v for v in layers)) == pytest.approx(
            values[f"l2_norm/{kind}/global"], rel=1e-6)


def test_per_parameter_gradient_norms_by_default_as_composer() -> None:
    """Composer's ``OptimizerMonitor()`` logs ``l2_norm/grad/<name>`` for every parameter
    that has a gradient (the ComposerModel's names, ``module.2.weight`` for Composer's
    ``SimpleModel``), at every logged step."""
    memory = InMemoryLogger()
    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=4),
                      max_duration="4ba", seed=0, progress_bar=False,
                      callbacks=[OptimizerMonitor(batch_log_interval=2)], loggers=[memory])
    trainer.fit()
    trainer.close()
    for name, _ in SimpleModel().named_parameters():
        steps, _values = memory.steps_and_values(f"l2_norm/grad/{name}")
        assert steps == [2, 4], name


def test_rejects_a_bad_interval() -> None:
    with pytest.raises(ValueError, match="batch_log_interval"):
        OptimizerMonitor(batch_log_interval=0)
    with pytest.raises(ValueError, match="batch_log_interval"):
        OptimizerMonitor(batch_log_interval="1ep")


def test_composer_signature_and_defaults() -> None:
    import inspect

    params = inspect.signature(OptimizerMonitor).parameters
    assert list(params)[:2] == ["log_optimizer_metrics", "batch_log_interval"]
    monitor = OptimizerMonitor()
    assert monitor.log_optimizer_metrics is True and monitor.batch_log_interval == 10
    with pytest.warns(DeprecationWarning, match="batch_log_interval"):
        assert OptimizerMonitor(log_interval=3).batch_log_interval == 3


def test_logs_decoupled_adamw_per_parameter_metrics() -> None:
    from cadence.optim.decoupled_weight_decay import DecoupledAdamW

    memory = InMemoryLogger()
    torch.manual_seed(0)
    model = SimpleModel()
    optimizer = DecoupledAdamW(model.parameters(), lr=1e-2)
    trainer = Trainer(model=model, train_dataloader=make_dataloader(num_batches=2),
                      max_duration="2ba", seed=0, progress_bar=False, optimizers=optimizer,
                      callbacks=[OptimizerMonitor(batch_log_interval=2)], loggers=[memory])
    trainer.fit()
    trainer.close()
    values = memory.most_recent_values
    for name, param in trainer.state.model.named_parameters():
        moment = optimizer.state[param]["exp_avg"]
        assert values[f"l2_norm/moment/{name}"] == pytest.approx(float(moment.norm()), rel=1e-6)
        norm = float(param.detach().norm())
        assert values[f"l2_norm/param/{name}"] == pytest.approx(norm, rel=1e-6)
        assert f"l2_norm/update/{name}" in values
    quiet = InMemoryLogger()
    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=2),
                      max_duration="2ba", seed=0, progress_bar=False,
                      optimizers=DecoupledAdamW(SimpleModel().parameters()),
                      callbacks=[OptimizerMonitor(False, 2)], loggers=[quiet])
    trainer.fit()
    trainer.close()
    assert not any(key.startswith("l2_norm/moment/") for key in quiet.most_recent_values)


def _full_batch_grad_norm(seed: int, x: torch.Tensor, y: torch.Tensor) -> float:
    torch.manual_seed(seed)
    model = SimpleModel()
    model.loss(model((x, y)), (x, y)).backward()
    return float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=math.inf))


@pytest.mark.world_size(2)
def test_global_grad_norm_under_ddp_and_fsdp_equals_one_process() -> None:
    """Each rank trains on half of each batch; the averaged (DDP) or reduce-scattered (FSDP2)
    gradient is the full batch's, so its norm must equal one process's on the full batch."""
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 8, generator=gen), torch.randint(0, 3, (8,), generator=gen)
    dataset = TensorDataset(x, y)
    # Rank r's first batch is samples r and r + 2: both ranks together see samples 0..3.
    expected = _full_batch_grad_norm(seed=0, x=x[:4], y=y[:4])
    for parallelism in (None, {"fsdp": {}}):
        torch.manual_seed(0)
        model = SimpleModel()
        loader = DataLoader(dataset, batch_size=2,
                            sampler=dist.get_sampler(dataset, shuffle=False))
        memory = InMemoryLogger()
        trainer = Trainer(model=model, train_dataloader=loader, max_duration="1ba", seed=0,
                          progress_bar=False, run_name="norms",
                          callbacks=[OptimizerMonitor(batch_log_interval=1)], loggers=[memory],
                          parallelism_config=parallelism)
        trainer.fit()
        trainer.close()
        sharded = any(isinstance(p, DTensor) for p in trainer.state.model.parameters())
        assert sharded == (parallelism is not None)
        got = memory.most_recent_values["l2_norm/grad/global"]
        assert got == pytest.approx(expected, rel=1e-5), f"parallelism_config={parallelism}"
        # The parameter norm is the same on every rank (the full model's, not a shard's).
        norms = dist.all_gather_object(memory.most_recent_values["l2_norm/param/global"])
        assert norms[0] == pytest.approx(norms[1], rel=1e-6)
