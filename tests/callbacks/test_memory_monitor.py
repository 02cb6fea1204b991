from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from cadence import State, Trainer
from cadence.callbacks import MemoryMonitor
from cadence.callbacks.memory_monitor import host_memory_report
from cadence.loggers import InMemoryLogger, Logger
from tests.common.models import SimpleModel, make_dataloader


def test_logs_positive_rss_on_cpu() -> None:
    memory = InMemoryLogger()
    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=5),
                      max_duration="5ba", seed=0, progress_bar=False,
                      callbacks=[MemoryMonitor(log_interval=2)], loggers=[memory], device="cpu")
    trainer.fit()
    steps, rss = memory.steps_and_values("memory/rss_bytes")
    assert steps == [1, 2, 4]  # the first step, then every log_interval
    assert all(isinstance(v, int) and v > 10 * 2**20 for v in rss)  # a Python + torch process
    _, peak = memory.steps_and_values("memory/peak_rss_bytes")
    assert all(p >= r for p, r in zip(peak, rss))
    assert not any(key.startswith("memory/allocated") for key in memory.data)  # CUDA only


def test_host_report_is_in_bytes() -> None:
    report = host_memory_report()
    status = Path("/proc/self/status").read_text()
    vm_rss = int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1])
    # the kernel's own figure, in KiB; read a moment later, so allow a little drift
    assert abs(report["rss_bytes"] - vm_rss * 1024) < 16 * 2**20
    assert report["peak_rss_bytes"] >= report["rss_bytes"] > 50 * 2**20


class FakeAllocator:
    """Stands in for ``torch.cuda.memory_stats`` on a machine without CUDA."""

    def __init__(self) -> None:
        self.retries = 0

    def __call__(self, device: object = None) -> dict[str, int]:
        return {"allocated_bytes.all.current": 3 * 2**30, "reserved_bytes.all.current": 4 * 2**30,
                "allocated_bytes.all.peak": 5 * 2**30, "reserved_bytes.all.peak": 6 * 2**30,
                "num_alloc_retries": self.retries, "num_ooms": 0}


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> FakeAllocator:
    allocator = FakeAllocator()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_stats", allocator)
    return allocator


def test_cuda_figures_and_retry_warning(fake_cuda: FakeAllocator,
                                        caplog: pytest.LogCaptureFixture) -> None:
    state = State(model=torch.nn.Linear(2, 2), device=torch.device("cuda", 0),
                  device_train_microbatch_size=8)
    memory = InMemoryLogger()
    logger = Logger(state, [memory])
    monitor = MemoryMonitor(log_interval=1, retry_warning_interval=3)
    monitor.fit_start(state, logger)
    warned_at = []
    for batch, retries in enumerate([0, 2, 3, 3, 5, 9, 9], start=1):
        fake_cuda.retries = retries
        state.timestamp = state.timestamp.to_next_batch(samples=8)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="cadence.callbacks.memory_monitor"):
            monitor.batch_end(state, logger)
        if caplog.records:
            warned_at.append(batch)
            message = caplog.records[0].getMessage()
            assert "device_train_microbatch_size (now 8)" in message and "25%" in message
    # Retries rose at batches 2, 3, 5 and 6; warnings at most once per 3 batches.
    assert warned_at == [2, 5]
    values = memory.most_recent_values
    assert values["memory/allocated_mem"] == 3 * 2**30
    assert values["memory/reserved_mem"] == 4 * 2**30
    assert values["memory/peak_allocated_mem"] == 5 * 2**30
    assert values["memory/num_alloc_retries"] == 9
    assert values["memory/num_ooms"] == 0
    assert values["memory/rss_bytes"] > 0  # the host figure is logged on CUDA runs too


@pytest.mark.parametrize("kwargs", [{"log_interval": 0}, {"log_interval": "1ep"},
                                    {"retry_warning_interval": 0},
                                    {"dist_aggregate_batch_interval": 0},
                                    {"memory_keys": {"allocated_bytes.all.current": 1}}])
def test_rejects_bad_intervals(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="MemoryMonitor"):
        MemoryMonitor(**kwargs)  # type: ignore[arg-type]


def test_dist_aggregate_logs_avg_min_max_on_its_interval() -> None:
    memory = InMemoryLogger()
    monitor = MemoryMonitor(dist_aggregate_batch_interval=2, log_interval=1)
    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=4),
                      max_duration="4ba", seed=0, progress_bar=False, callbacks=[monitor],
                      loggers=[memory], device="cpu")
    trainer.fit()
    steps, _ = memory.steps_and_values("memory/rss_bytes_max")
    assert steps == [2, 4]  # every dist_aggregate_batch_interval batches only
    _, low = memory.steps_and_values("memory/rss_bytes_min")
    _, high = memory.steps_and_values("memory/rss_bytes_max")
    _, mean = memory.steps_and_values("memory/rss_bytes_avg")
    assert all(lo == av == hi > 0 for lo, av, hi in zip(low, mean, high))  # one rank
