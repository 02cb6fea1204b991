"""ProfilerCallback: real torch.profiler traces of short CPU fits, parsed back as JSON."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from cadence import Trainer
from cadence.callbacks import ProfilerCallback
from cadence.registry import registry
from cadence.utils import dist
from tests.common.models import SimpleModel, make_dataloader


def fit(profiler: ProfilerCallback, batches: int = 4, epoch: int = 0, **kwargs: Any) -> Trainer:
    loader = make_dataloader(num_batches=max(batches, epoch))  # epoch: batches per epoch
    trainer = Trainer(model=SimpleModel(), train_dataloader=loader,
                      max_duration=f"{batches}ba", seed=0, progress_bar=False,
                      callbacks=[profiler], **kwargs)
    trainer.fit()
    trainer.close()
    return trainer


def events(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def test_trace_parses_and_holds_the_steps_aten_ops(tmp_path: Path) -> None:
    profiler = ProfilerCallback(skip_first=1, warmup=1, active=2, record_shapes=True)
    fit(profiler, run_name="prof", save_folder=str(tmp_path / "{run_name}"), save_interval=None)
    # batch 1 skipped, batch 2 warm-up, batches 3-4 recorded: written at the end of batch 4
    assert profiler.saved_traces == [tmp_path / "prof" / "torch_traces" / "rank0.4.pt.trace.json"]
    trace = events(profiler.saved_traces[0])
    names = {e.get("name", "") for e in trace}
    assert {"ProfilerStep#2", "ProfilerStep#3"} <= names  # the two recorded steps, no others
    assert not any(n.startswith("ProfilerStep#") and n not in ("ProfilerStep#2", "ProfilerStep#3")
                   for n in names)
    assert {"aten::addmm", "aten::mm"} & names  # Linear forward/backward
    assert any(e.get("name") == "aten::addmm" and "Input Dims" in e.get("args", {})
               for e in trace)  # record_shapes


def test_window_cut_short_and_repeat_and_gzip(tmp_path: Path) -> None:
    profiler = ProfilerCallback(warmup=1, active=2, repeat=0, folder=str(tmp_path / "t"),
                                filename="{run_name}-{epoch}-{batch}.json", use_gzip=True)
    fit(profiler, batches=5, epoch=8, run_name="r")
    # Composer's cyclic schedule, within an 8-batch epoch: cycles of 3: warm-up 1, record
    # 2-3 (written); warm-up 4, record 5, cut short by the end of the fit (5ba) and written
    # at FIT_END
    assert [p.name for p in profiler.saved_traces] == ["r-0-3.json.gz", "r-0-5.json.gz"]
    for path in profiler.saved_traces:
        assert any(e.get("name", "").startswith("aten::") for e in events(path))


def test_tensorboard_trace_handler(tmp_path: Path) -> None:
    profiler = ProfilerCallback(warmup=1, active=1, trace_handler="tensorboard",
                                folder=str(tmp_path / "tb"))
    fit(profiler, batches=2, run_name="r")
    (path,) = profiler.saved_traces
    assert path.parent == tmp_path / "tb" and path.name.startswith("rank0.")
    assert path.name.endswith(".pt.trace.json")
    assert any(e.get("name", "").startswith("aten::") for e in events(path))


@pytest.mark.world_size(2)
def test_rank_zero_only_unless_all_ranks(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    dataset = TensorDataset(torch.randn(16, 8, generator=gen),
                            torch.randint(0, 3, (16,), generator=gen))

    def run(profiler: ProfilerCallback, name: str) -> None:
        loader = DataLoader(dataset, batch_size=2,
                            sampler=dist.get_sampler(dataset, shuffle=False))
        trainer = Trainer(model=SimpleModel(), train_dataloader=loader, max_duration="2ba",
                          seed=0, progress_bar=False, run_name=name, callbacks=[profiler])
        trainer.fit()
        trainer.close()

    folder = str(tmp_path / "{run_name}")
    run(ProfilerCallback(warmup=1, active=1, folder=folder), "zero")
    run(ProfilerCallback(warmup=1, active=1, folder=folder, all_ranks=True), "every")
    dist.barrier()
    assert sorted(p.name for p in (tmp_path / "zero").iterdir()) == ["rank0.2.pt.trace.json"]
    assert sorted(p.name for p in (tmp_path / "every").iterdir()) == [
        "rank0.2.pt.trace.json", "rank1.2.pt.trace.json"]
    dist.barrier()  # rank 0 keeps the files until both ranks have looked


@pytest.mark.parametrize("kwargs, match", [
    ({"active": 0}, "active must be an integer >= 1"), ({"wait": -1}, "wait"),
    ({"skip_first": 1.5}, "skip_first"), ({"trace_handler": "perfetto"}, "'chrome'"),
    ({"activities": ["gpu"]}, "'cuda'"),
])
def test_rejects_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ProfilerCallback(**kwargs)


def test_nameable_from_yaml() -> None:
    assert registry.callbacks.get("profiler") is ProfilerCallback
