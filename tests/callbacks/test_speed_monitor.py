from __future__ import annotations

from pathlib import Path

import pytest
import torch

import cadence.callbacks.speed_monitor as speed_monitor_module
from cadence.callbacks import SpeedMonitor
from cadence.registry import registry
from cadence.core import State, Time
from cadence.loggers import InMemoryLogger, Logger
from tests.common.clock import FakeClock, install_fake_clock


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    return install_fake_clock(monkeypatch, speed_monitor_module, start=100.0)


def make() -> tuple[State, InMemoryLogger, Logger]:
    model = torch.nn.Linear(2, 2)
    state = State(model=model, optimizers=[torch.optim.SGD(model.parameters(), lr=0.1)],
                  max_duration=Time(2, "ep"), dataloader_len=100)
    memory = InMemoryLogger()
    return state, memory, Logger(state, [memory])


def train(state: State, monitor: SpeedMonitor, logger: Logger, clock: FakeClock,
          seconds: list[float], samples: int = 8, tokens: int = 512) -> None:
    for duration in seconds:
        monitor.batch_start(state, logger)
        clock.now += duration
        state.timestamp = state.timestamp.to_next_batch(samples=samples, tokens=tokens)
        monitor.batch_end(state, logger)


def test_throughput_is_samples_over_elapsed(clock: FakeClock) -> None:
    state, memory, logger = make()
    monitor = SpeedMonitor(window_size=3, time_unit="seconds")
    monitor.fit_start(state, logger)
    train(state, monitor, logger, clock, [5.0])  # first batch: warm-up, no throughput yet
    assert "throughput/samples_per_sec" not in memory.most_recent_values
    assert memory.most_recent_values["time/train"] == pytest.approx(5.0)
    train(state, monitor, logger, clock, [0.5])
    values = memory.most_recent_values
    assert values["throughput/samples_per_sec"] == pytest.approx(8 / 0.5)
    assert values["throughput/batches_per_sec"] == pytest.approx(1 / 0.5)
    assert values["throughput/tokens_per_sec"] == pytest.approx(512 / 0.5)
    assert values["throughput/device/samples_per_sec"] == pytest.approx(8 / 0.5)  # world 1
    assert values["throughput/device/batches_per_sec"] == pytest.approx(1 / 0.5)
    assert "throughput/flops_per_sec" not in values  # nn.Linear has no flops_per_batch
    # Window of 3 batches: the last three took 1 + 2 + 2 seconds.
    train(state, monitor, logger, clock, [0.5, 1.0, 2.0, 2.0])
    values = memory.most_recent_values
    assert values["throughput/samples_per_sec"] == pytest.approx(3 * 8 / 5.0)
    assert values["throughput/batches_per_sec"] == pytest.approx(3 / 5.0)
    assert values["time/train"] == pytest.approx(11.0)
    steps, _ = memory.steps_and_values("throughput/samples_per_sec")
    assert steps == [2, 3, 4, 5, 6]


def test_composers_history_attributes_hold_the_window(clock: FakeClock) -> None:
    """Composer's ``history_samples`` / ``history_tokens`` / ``history_wct`` /
    ``history_flops``: one entry per batch of the window (newest last), still readable
    after ``FIT_END``."""
    state, _memory, logger = make()
    monitor = SpeedMonitor(window_size=3, time_unit="seconds")
    monitor.fit_start(state, logger)
    train(state, monitor, logger, clock, [5.0, 0.5], samples=4, tokens=64)
    assert list(monitor.history_samples) == [4] and monitor.history_samples.maxlen == 3
    train(state, monitor, logger, clock, [1.0, 2.0, 3.0], samples=8, tokens=128)
    monitor.fit_end(state, logger)
    assert list(monitor.history_samples) == [8, 8, 8]
    assert list(monitor.history_tokens) == [128, 128, 128]
    assert list(monitor.history_wct) == pytest.approx([1.0, 2.0, 3.0])
    assert list(monitor.history_flops) == [0.0, 0.0, 0.0]  # no flops_per_batch


def test_eval_time_is_excluded(clock: FakeClock) -> None:
    state, memory, logger = make()
    monitor = SpeedMonitor(window_size=10, time_unit="seconds")
    monitor.fit_start(state, logger)
    train(state, monitor, logger, clock, [1.0, 1.0])
    for event in ("eval_before_all", "eval_start"):
        getattr(monitor, event)(state, logger)
    clock.now += 30.0
    monitor.eval_end(state, logger)
    clock.now += 5.0  # between evaluators: still eval
    monitor.eval_start(state, logger)
    clock.now += 5.0
    monitor.eval_end(state, logger)
    monitor.eval_after_all(state, logger)
    train(state, monitor, logger, clock, [1.0])
    values = memory.most_recent_values
    assert values["throughput/samples_per_sec"] == pytest.approx(2 * 8 / 2.0)
    assert values["time/train"] == pytest.approx(3.0)
    assert values["time/val"] == pytest.approx(40.0)
    assert values["time/total"] == pytest.approx(43.0)


def test_eval_start_end_alone(clock: FakeClock) -> None:
    state, memory, logger = make()
    monitor = SpeedMonitor(time_unit="seconds")
    monitor.fit_start(state, logger)
    train(state, monitor, logger, clock, [1.0])
    monitor.eval_start(state, logger)
    clock.now += 7.0
    monitor.eval_end(state, logger)
    train(state, monitor, logger, clock, [1.0])
    assert memory.most_recent_values["time/train"] == pytest.approx(2.0)
    assert memory.most_recent_values["time/val"] == pytest.approx(7.0)


def test_per_device_and_no_tokens(clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")
    state, memory, logger = make()
    monitor = SpeedMonitor(time_unit="seconds")
    monitor.fit_start(state, logger)
    train(state, monitor, logger, clock, [1.0, 2.0], samples=32, tokens=0)
    values = memory.most_recent_values
    assert values["throughput/samples_per_sec"] == pytest.approx(16.0)
    assert values["throughput/device/samples_per_sec"] == pytest.approx(4.0)
    assert values["throughput/batches_per_sec"] == pytest.approx(0.5)
    assert values["throughput/device/batches_per_sec"] == pytest.approx(0.5 / 4)
    assert "throughput/tokens_per_sec" not in values


def test_wall_clock_resumes_from_state_dict(clock: FakeClock) -> None:
    state, memory, logger = make()
    monitor = SpeedMonitor(time_unit="seconds")
    monitor.fit_start(state, logger)
    train(state, monitor, logger, clock, [3.0, 4.0])
    saved = monitor.state_dict()
    assert saved["train_seconds"] == pytest.approx(7.0)

    resumed = SpeedMonitor(time_unit="seconds")
    resumed.load_state_dict(saved)
    clock.now += 60.0  # restart time is not training time
    resumed.fit_start(state, logger)
    train(state, resumed, logger, clock, [2.0])
    assert memory.most_recent_values["time/train"] == pytest.approx(9.0)
    resumed.fit_end(state, logger)
    resumed.close()
    resumed.close()


def test_no_fit_start_still_measures(clock: FakeClock) -> None:
    state, memory, logger = make()
    monitor = SpeedMonitor(time_unit="seconds")
    train(state, monitor, logger, clock, [1.0, 1.0, 1.0])
    assert memory.most_recent_values["throughput/batches_per_sec"] == pytest.approx(1.0)


@pytest.mark.parametrize("bad", [0, -1, 2.5])
def test_rejects_bad_window(bad: float) -> None:
    with pytest.raises(ValueError, match="window_size"):
        SpeedMonitor(window_size=bad)  # type: ignore[arg-type]


def test_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_builtins_loaded", True)
    assert registry.callbacks.get("speed_monitor") is SpeedMonitor


# -- FLOP/s and MFU ---------------------------------------------------------------------------
class CountedLinear(torch.nn.Linear):
    """A model that reports ``flops_per_batch``: 1e9 FLOPs per sample (rows of the batch)."""

    def flops_per_batch(self, batch: torch.Tensor) -> float:
        return 1e9 * batch.shape[0]


def make_counted(**state_kwargs: object) -> tuple[State, InMemoryLogger, Logger]:
    model = CountedLinear(2, 2)
    state = State(model=model, optimizers=[torch.optim.SGD(model.parameters(), lr=0.1)],
                  max_duration=Time(2, "ep"), dataloader_len=100, **state_kwargs)
    state.batch = torch.zeros(8, 2)
    memory = InMemoryLogger()
    return state, memory, Logger(state, [memory])


def test_mfu_is_flops_per_batch_times_batches_per_sec_over_peak(
        clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    state, memory, logger = make_counted()
    monitor = SpeedMonitor(window_size=2, peak_flops=1e10)
    monitor.fit_start(state, logger)
    train(state, monitor, logger, clock, [9.0, 2.0, 2.0])  # window: the last two batches
    values = memory.most_recent_values
    assert values["throughput/device/batches_per_sec"] == pytest.approx(0.25)  # 0.5 / 2 ranks
    device_flops = 8e9 * 0.5  # this rank's FLOPs per batch x batches per second
    assert values["throughput/device/flops_per_sec"] == pytest.approx(device_flops)
    assert values["throughput/flops_per_sec"] == pytest.approx(2 * device_flops)
    assert values["throughput/device/mfu"] == pytest.approx(device_flops / 1e10)


def test_no_mfu_without_a_peak_on_cpu(clock: FakeClock) -> None:
    state, memory, logger = make_counted()
    monitor = SpeedMonitor()
    train(state, monitor, logger, clock, [1.0, 1.0])
    assert memory.most_recent_values["throughput/device/flops_per_sec"] == pytest.approx(8e9)
    assert "throughput/device/mfu" not in memory.most_recent_values


@pytest.mark.parametrize("precision, name, peak", [
    ("amp_bf16", "NVIDIA H100 80GB HBM3", 989.4e12),
    ("amp_fp16", "NVIDIA A100-SXM4-80GB", 312e12),
])
def test_peak_comes_from_the_table_for_a_known_gpu(
        clock: FakeClock, monkeypatch: pytest.MonkeyPatch, precision: str, name: str,
        peak: float) -> None:
    """The table lookup the callback does on a GPU, without one: the device is named."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    state, memory, logger = make_counted(device=torch.device("cuda"), precision=precision)
    monitor = SpeedMonitor()
    train(state, monitor, logger, clock, [1.0, 0.5])
    assert memory.most_recent_values["throughput/device/mfu"] == pytest.approx(8e9 * 2 / peak)


def test_unknown_gpu_is_reported_once_and_has_no_mfu(
        clock: FakeClock, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    state, memory, logger = make_counted(device=torch.device("cuda"), precision="amp_bf16")
    monitor = SpeedMonitor()
    with caplog.at_level("WARNING", logger="cadence.callbacks.speed_monitor"):
        train(state, monitor, logger, clock, [1.0, 1.0, 1.0])
    assert "throughput/device/mfu" not in memory.most_recent_values
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "'Tesla T4'" in messages[0] and "peak_flops" in messages[0]


def test_mfu_of_a_real_gpt2_fit_on_cpu(tmp_path: Path) -> None:
    """A real fit: the logged MFU is the model's FLOPs per batch x batches/s / peak, and
    the FLOPs per token hold the attention term 12 L H Q T."""
    from cadence import Trainer
    from cadence.models.gpt import gpt2

    n_layer, n_head, n_embd, vocab, seq, batch_size = 2, 2, 32, 128, 16, 4
    model = gpt2(n_layer=n_layer, n_head=n_head, n_embd=n_embd, vocab_size=vocab,
                 max_seq_len=seq)
    ids = torch.randint(0, vocab, (6 * batch_size, seq), generator=torch.Generator().manual_seed(0))
    loader = torch.utils.data.DataLoader(
        [{"input_ids": row, "labels": row} for row in ids], batch_size=batch_size)
    memory = InMemoryLogger()
    trainer = Trainer(model=model, train_dataloader=loader, max_duration="6ba", seed=0,
                      progress_bar=False, loggers=[memory], save_folder=None,
                      callbacks=[SpeedMonitor(window_size=3, peak_flops=1e11)])
    trainer.fit()
    trainer.close()
    values = memory.most_recent_values
    flops_per_batch = model.flops_per_batch({"input_ids": ids[:batch_size]})
    assert values["throughput/device/mfu"] == pytest.approx(
        flops_per_batch * values["throughput/batches_per_sec"] / 1e11, rel=1e-9)
    # FLOPs per token = 6 N + 12 L H Q T, N without the position embedding (seq x n_embd).
    n_matmul = sum(p.numel() for p in model.parameters()) - seq * n_embd
    per_token = 6 * n_matmul + 12 * n_layer * n_head * (n_embd // n_head) * seq
    assert values["throughput/flops_per_sec"] / values["throughput/tokens_per_sec"] == \
        pytest.approx(per_token, rel=1e-9)
    assert 12 * n_layer * n_embd * seq / per_token > 0.01  # the attention term is in there


def test_time_unit_defaults_to_hours_as_composer(clock: FakeClock) -> None:
    state, memory, logger = make()
    monitor = SpeedMonitor()
    monitor.fit_start(state, logger)
    train(state, monitor, logger, clock, [1800.0])
    assert memory.most_recent_values["time/train"] == pytest.approx(0.5)
    minutes = SpeedMonitor(time_unit="minutes")
    minutes.fit_start(state, logger)
    train(state, minutes, logger, clock, [90.0])
    assert memory.most_recent_values["time/total"] == pytest.approx(1.5)


def test_composer_spelling_of_the_peak() -> None:
    assert SpeedMonitor(gpu_flops_available=312e12).peak_flops == 312e12


@pytest.mark.parametrize("kwargs, match", [
    ({"peak_flops": 0}, "peak_flops"), ({"peak_flops": -1.0}, "peak_flops"),
    ({"peak_flops": "fast"}, "peak_flops"), ({"peak_flops": True}, "peak_flops"),
    ({"peak_flops": 1e12, "gpu_flops_available": 1e12}, "not both"),
    ({"time_unit": "hour"}, "'hours'"),
])
def test_rejects_bad_arguments(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SpeedMonitor(**kwargs)  # type: ignore[arg-type]


def test_flops_per_batch_must_be_callable(clock: FakeClock) -> None:
    state, memory, logger = make()
    state.model.flops_per_batch = 5  # type: ignore[assignment]
    with pytest.raises(TypeError, match="flops_per_batch must be a callable"):
        train(state, SpeedMonitor(), logger, clock, [1.0])
