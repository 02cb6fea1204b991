"""SystemMetricsMonitor: psutil's host figures every batch; GPU figures reduced across ranks."""

from __future__ import annotations

import psutil
import pytest
import torch

from cadence import Trainer
from cadence.callbacks import SystemMetricsMonitor
from cadence.registry import registry
from cadence.loggers import InMemoryLogger
from tests.common.models import SimpleModel, make_dataloader


def test_logs_psutil_values_every_train_and_eval_batch() -> None:
    model = SimpleModel()
    memory = InMemoryLogger()
    trainer = Trainer(model=model, train_dataloader=make_dataloader(3), max_duration="3ba",
                      eval_dataloader=make_dataloader(2, seed=1), eval_interval="3ba",
                      optimizers=torch.optim.SGD(model.parameters(), lr=0.1), loggers=[memory],
                      callbacks=[SystemMetricsMonitor()], progress_bar=False, device="cpu",
                      seed=0)
    trainer.fit()
    trainer.close()
    total = psutil.virtual_memory().total
    _, totals = memory.steps_and_values("cpu_memory_total")
    assert len(totals) == 3 + 2  # 3 train batches, 2 eval batches
    assert set(totals) == {total}  # the host's RAM, as psutil reports it
    _, used = memory.steps_and_values("cpu_memory_used")
    assert all(0 < u < total for u in used)
    disk = psutil.disk_usage("/")
    assert memory.most_recent_values["disk_memory_total"] == disk.total
    assert 0.0 <= memory.most_recent_values["cpu_percentage"] <= 100.0 * psutil.cpu_count()
    assert not any(key.startswith(("min_", "max_", "Rank_")) for key in memory.data)  # CPU run
    assert registry.callbacks.get("system_metrics_monitor") is SystemMetricsMonitor


@pytest.mark.parametrize("log_all_data", [False, True])
def test_gpu_figures_reduced_across_ranks(log_all_data: bool) -> None:
    per_rank = [{"gpu_percentage": 80, "memory_used_bytes": 5, "memory_free_bytes": 9,
                 "memory_percentage": 10, "gpu_temperature_C": 60, "gpu_power_usage_W": 300.0},
                {"gpu_percentage": 20, "memory_used_bytes": 7, "memory_free_bytes": 3,
                 "memory_percentage": 30, "gpu_temperature_C": 70, "gpu_power_usage_W": 100.0}]
    summary = SystemMetricsMonitor(log_all_data=log_all_data)._gpu_summary(per_rank)
    if log_all_data:
        assert summary["Rank_0_gpu_percentage"] == 80
        assert summary["Rank_1_gpu_power_usage_W"] == 100.0
        assert len(summary) == 12
    else:
        assert summary["min_gpu_percentage/Rank_1"] == 20
        assert summary["max_gpu_percentage/Rank_0"] == 80
        assert summary["max_memory_used_bytes/Rank_1"] == 7
        assert summary["min_gpu_power_usage_W/Rank_1"] == 100.0
        assert len(summary) == 12
