"""ActivationMonitor: the right statistics of named layers' inputs and outputs, at the
interval, hooks removed in between."""

from __future__ import annotations

import copy

import pytest
import torch

from cadence import Trainer
from cadence.callbacks import ActivationMonitor
from cadence.callbacks.activation_monitor import activation_stats, compute_kurtosis
from cadence.registry import registry
from cadence.loggers import InMemoryLogger
from tests.common.models import SimpleModel, make_dataloader


def test_logs_layer_stats_with_the_right_values_at_the_interval() -> None:
    model = SimpleModel()
    initial = copy.deepcopy(model)
    loader = make_dataloader(3)
    x = next(iter(loader))[0]  # the first batch's features, [4, 8]
    memory = InMemoryLogger()
    monitor = ActivationMonitor(interval="10ba", ignore_module_types=["net.1"],
                                only_log_wandb=True)  # no WandBLogger: every destination
    trainer = Trainer(model=model, train_dataloader=loader, max_duration="11ba",
                      optimizers=torch.optim.SGD(model.parameters(), lr=0.1), loggers=[memory],
                      callbacks=[monitor], progress_bar=False, device="cpu", seed=0)
    trainer.fit()
    trainer.close()

    hidden = initial.net[0](x)  # what the first layer returned on batch 0 (initial weights)
    steps, values = memory.steps_and_values("activations/l2_norm/net.0_input.0")
    assert steps == [0, 10]  # batches 0 and 10 (0-based), nothing in between
    torch.testing.assert_close(values[0], x.norm(dim=-1).mean().item())
    for stat, expected in {
        "l2_norm": hidden.norm(dim=-1).mean(), "average": hidden.mean(),
        "max": hidden.max(dim=-1).values.mean(), "kurtosis": compute_kurtosis(hidden),
    }.items():
        _, logged = memory.steps_and_values(f"activations/{stat}/net.0_output.0")
        torch.testing.assert_close(logged[0], expected.item(), rtol=1e-5, atol=1e-6)
    # the model's own input is the batch list: x is "_0", the integer labels are skipped
    assert "activations/average/_0_input.0" in memory.data
    assert not any("_1_input" in key for key in memory.data)
    assert not any("/net.1_" in key for key in memory.data)  # ignored by name
    assert "activations/max/net.2_output.0" in memory.data
    assert monitor.handles == []  # hooks removed after the hooked forward


def test_stats_of_known_tensors() -> None:
    value = torch.tensor([[1.0, -1.0, 1.0, -1.0], [3.0, 0.0, 0.0, 0.0]])
    stats = activation_stats(value)
    assert stats["l2_norm"] == pytest.approx((2.0 + 3.0) / 2)
    assert stats["max"] == pytest.approx((1.0 + 3.0) / 2)
    assert stats["average"] == pytest.approx(3.0 / 8)
    # row 1: all |x - mu| = 1 -> kurtosis 1; row 2: mu 0.75, m2 1.6875, m4 6.6445 -> 7/3
    assert stats["kurtosis"] == pytest.approx((1.0 + 6.64453125 / 1.6875 ** 2) / 2)
    assert activation_stats(torch.tensor([1, 2])) == {}  # integers are not activations


def test_arguments() -> None:
    with pytest.warns(UserWarning, match="below 10 batches"):
        ActivationMonitor(interval="2ba")
    with pytest.raises(ValueError, match="interval"):
        ActivationMonitor(interval="5sp")
    assert registry.callbacks.get("activation_monitor") is ActivationMonitor
