"""MemorySnapshot and OOMObserver: on CPU a clear no-op with one warning; the snapshot files
written and uploaded when the allocator history is there (CUDA, or its API stood in for)."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from cadence import Trainer
from cadence.callbacks import MemorySnapshot, OOMObserver
from cadence.registry import registry
from cadence.core import State
from tests.common.models import SimpleModel, make_dataloader


def _fit(callback: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the default folders are relative, as in Composer
    model = SimpleModel()
    trainer = Trainer(model=model, train_dataloader=make_dataloader(3), max_duration="5ba",
                      optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
                      callbacks=[callback], progress_bar=False, device="cpu", seed=0,
                      run_name="snap")
    trainer.fit()
    trainer.close()


@pytest.mark.parametrize("make", [MemorySnapshot, OOMObserver])
def test_cpu_run_is_a_no_op_with_one_warning(make: Any, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history",
                        lambda *a, **k: calls.append((a, k)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _fit(make(), tmp_path, monkeypatch)
    ours = [w for w in caught if "CUDA devices only" in str(w.message)]
    assert len(ours) == 1 and "model is on cpu" in str(ours[0].message)
    assert calls == []  # the allocator was never touched
    assert not (tmp_path / "snap").exists()  # no folder made


class _FakeLogger:
    def __init__(self) -> None:
        self.uploads: list[tuple[str, str, bool]] = []

    def upload_file(self, remote: str, path: str, *, overwrite: bool) -> None:
        self.uploads.append((remote, str(path), overwrite))


def _cuda_state(tmp_path: Path) -> State:
    model = torch.nn.Linear(2, 2, device="meta")  # stands for a model on CUDA
    return State(model=model, run_name="snap")


def test_snapshot_recorded_over_the_interval_written_and_uploaded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    history: list[Any] = []
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history",
                        lambda enabled="all", **k: history.append(enabled))
    snapshot = {"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": 512,
                                                    "stream": 0, "frames": []}]]}
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda: snapshot)
    from torch.cuda import _memory_viz

    monkeypatch.setattr(_memory_viz, "trace_plot", lambda snap: f"<html>{len(snap)}</html>")
    state = _cuda_state(tmp_path)
    logger = _FakeLogger()
    callback = MemorySnapshot(skip_batches=1, interval="2ba")
    callback.init(state, logger)
    for _ in range(5):
        callback.batch_start(state, logger)
        state.timestamp = state.timestamp.to_next_batch(samples=1)
        callback.batch_end(state, logger)
    assert history == ["all", None]  # started after 1 batch, stopped 2 batches later
    folder = tmp_path / "snap" / "torch_traces"
    assert sorted(p.name for p in folder.iterdir()) == [
        "rank0.3.memory_snapshot.html", "rank0.3.memory_snapshot.pickle"]
    assert pickle.loads((folder / "rank0.3.memory_snapshot.pickle").read_bytes()) == snapshot
    assert [u[0] for u in logger.uploads] == [
        "snap/torch_memory_traces/rank0.3.memory_snapshot.pickle",
        "snap/torch_memory_traces/rank0.3.memory_snapshot.html"]
    with pytest.raises(FileExistsError, match="not empty"):
        MemorySnapshot().init(_cuda_state(tmp_path), logger)


def test_oom_observer_dumps_snapshot_and_plots(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    observers: list[Any] = []
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", lambda *a, **k: None)
    monkeypatch.setattr(torch._C, "_cuda_attach_out_of_memory_observer", observers.append,
                        raising=False)
    snapshot = {"segments": [], "device_traces": [[{"action": "oom", "size": 1 << 30}]]}
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda: snapshot)
    from torch.cuda import _memory_viz

    for name in ("trace_plot", "segment_plot", "segments", "memory"):
        monkeypatch.setattr(_memory_viz, name, lambda snap, _n=name: _n)
    state = _cuda_state(tmp_path)
    logger = _FakeLogger()
    observer = OOMObserver()
    observer.init(state, logger)
    assert len(observers) == 1
    observers[0](0, 1 << 30, 0, 0)  # what PyTorch calls on OOM
    names = sorted(Path(p).name for p in observer.saved)
    assert names == ["rank0.oom_memory_flamegraph.svg", "rank0.oom_segment_flamegraph.svg",
                     "rank0.oom_segment_plot.html", "rank0.oom_snapshot.pickle",
                     "rank0.oom_trace_plot.html"]
    assert Path(observer.saved[2]).read_text() == "segment_plot"
    uploaded = sorted(u[0] for u in logger.uploads)
    assert uploaded[0] == "snap/oom_traces/rank0.oom_memory_flamegraph.svg"
    assert len(uploaded) == 5
    assert registry.callbacks.get("oom_observer") is OOMObserver
    assert registry.callbacks.get("memory_snapshot") is MemorySnapshot
