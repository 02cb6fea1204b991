"""Composer's profiler: Trainer(profiler=Profiler(cyclic_schedule(...), [JSONTraceHandler])),
the Chrome trace it writes, the schedule's actions, and bad input."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from cadence import Callback, State, Trainer
from cadence.core import Timestamp
from cadence.profiler import (
    JSONTraceHandler, Marker, Profiler, ProfilerAction, SystemProfiler, TorchProfiler,
    TraceHandler, cyclic_schedule,
)
from tests.common.models import SimpleModel, make_dataloader

A = ProfilerAction


class Spans(Callback):
    """Wraps each batch's loss step in a marker of its own."""

    def after_loss(self, state: Any, logger: Any) -> None:
        with state.profiler.marker("my/after_loss", categories=["mine"]):
            pass


def test_a_short_run_writes_a_chrome_trace_with_events_and_torch_ops(tmp_path: Path) -> None:
    traces, torch_traces = tmp_path / "traces", tmp_path / "torch"
    profiler = Profiler(cyclic_schedule(skip_first=1, warmup=1, active=2),
                        [JSONTraceHandler(folder=str(traces), remote_file_name=None)],
                        sys_prof_cpu=False, torch_prof_folder=str(torch_traces),
                        torch_prof_record_shapes=True)
    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=4),
                      max_duration="4ba", seed=0, progress_bar=False, run_name="prof",
                      profiler=profiler, callbacks=[Spans()])
    assert trainer.state.profiler is profiler
    trainer.fit()
    trainer.close()
    # batch 1 skipped, 2 warm-up, 3-4 recorded and saved at the end of batch 4
    path = traces / "ep0-ba4-rank0.json"
    with open(path) as f:
        events = json.load(f)
    spans = [e for e in events if e.get("ph") == "X"]
    assert all(e["dur"] >= 0 and e["pid"] == 0 for e in spans)
    forward = [e for e in spans if e["name"] == "event/forward"]  # BEFORE_ -> AFTER_FORWARD
    assert [e["args"]["batch"] for e in forward] == [1, 2, 3]  # warm-up and active batches
    names = {e["name"] for e in spans}
    assert {"event/batch_start", "event/dataloader", "event/backward", "event/train_batch",
            "my/after_loss"} <= names
    for e in forward:  # each forward span follows its BEFORE_FORWARD event's callbacks
        before = [b for b in spans if b["name"] == "event/before_forward"
                  and b["args"]["batch"] == e["args"]["batch"]]
        assert len(before) == 1 and before[0]["ts"] <= e["ts"]
    # the torch profiler's trace of the active steps, merged into the same file
    assert {"ProfilerStep#2", "ProfilerStep#3"} <= {e.get("name") for e in events}
    assert not {"ProfilerStep#0", "ProfilerStep#1"} & {e.get("name") for e in events}
    assert any(e.get("name") == "aten::addmm" and "Input Dims" in e.get("args", {})
               for e in events)
    torch_file = torch_traces / "rank0.4.pt.trace.json"
    assert torch_file.exists()
    handler = profiler.trace_handlers[0]
    assert [(int(ts.batch), paths) for ts, paths in handler.saved_traces] == [(4, [path])]
    with open(traces / "merged_trace.json") as f:
        assert len(json.load(f)) == len(events)  # one rank: the merge is this file


def test_cyclic_schedule_actions_per_batch() -> None:
    state = State(model=SimpleModel(), dataloader_len=9)

    def actions(schedule: Any) -> list[ProfilerAction]:
        out = []
        for index in range(9):
            state.timestamp = Timestamp(batch=index, batch_in_epoch=index)
            out.append(schedule(state))
        return out

    assert actions(cyclic_schedule(skip_first=1, wait=1, warmup=1, active=2, repeat=2)) == [
        A.SKIP, A.SKIP, A.WARMUP, A.ACTIVE, A.ACTIVE_AND_SAVE,
        A.SKIP, A.WARMUP, A.ACTIVE, A.ACTIVE_AND_SAVE]
    # repeat=0: cycles to the epoch's end, whose last batch saves the window it is in
    assert actions(cyclic_schedule(warmup=1, active=4, repeat=0))[-4:] == [
        A.WARMUP, A.ACTIVE, A.ACTIVE, A.ACTIVE_AND_SAVE]
    assert actions(cyclic_schedule(warmup=2, active=5, repeat=0)) == [
        A.WARMUP, A.WARMUP, A.ACTIVE, A.ACTIVE, A.ACTIVE, A.ACTIVE, A.ACTIVE_AND_SAVE,
        A.WARMUP, A.WARMUP]
    # after a resume at batch 2 of the epoch, skip_first counts from there
    profiler = Profiler(cyclic_schedule(skip_first=1, warmup=1, active=1), [],
                        sys_prof_cpu=False)
    profiler.bind_to_state(state)
    profiler.resumption_batch_idx = 2
    assert actions(profiler.schedule)[:6] == [A.SKIP, A.SKIP, A.SKIP, A.WARMUP,
                                              A.ACTIVE_AND_SAVE, A.SKIP]
    with pytest.raises(ValueError, match="active must be an integer >= 1"):
        cyclic_schedule(active=0)


def test_bad_input_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="TraceHandler instances"):
        Profiler(cyclic_schedule(), [object()])  # type: ignore[list-item]
    unbound = Profiler(cyclic_schedule(), [], sys_prof_cpu=False)
    with pytest.raises(RuntimeError, match="bound to the run"):
        unbound.marker("x")
    (tmp_path / "old.json").write_text("[]")
    profiler = Profiler(cyclic_schedule(), [JSONTraceHandler(folder=str(tmp_path))],
                        sys_prof_cpu=False, torch_prof_profile_memory=False,
                        torch_prof_with_flops=False)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        Trainer(model=SimpleModel(), train_dataloader=make_dataloader(), max_duration="1ba",
                progress_bar=False, profiler=profiler)
    with pytest.raises(ValueError, match="memory_filename needs"):
        TorchProfiler(memory_filename="m.html")


def test_composer_names_and_signatures() -> None:
    assert list(inspect.signature(Profiler).parameters) == [
        "schedule", "trace_handlers", "sys_prof_cpu", "sys_prof_memory", "sys_prof_disk",
        "sys_prof_net", "sys_prof_stats_thread_interval_seconds", "torch_prof_folder",
        "torch_prof_filename", "torch_prof_remote_file_name", "torch_prof_memory_filename",
        "torch_prof_memory_remote_file_name", "torch_prof_overwrite", "torch_prof_use_gzip",
        "torch_prof_record_shapes", "torch_prof_profile_memory", "torch_prof_with_stack",
        "torch_prof_with_flops", "torch_prof_num_traces_to_keep"]
    assert list(inspect.signature(cyclic_schedule).parameters) == [
        "skip_first", "wait", "warmup", "active", "repeat"]
    assert issubclass(JSONTraceHandler, TraceHandler) and issubclass(TraceHandler, Callback)
    assert issubclass(SystemProfiler, Callback) and callable(Marker.counter)
    assert [a.value for a in ProfilerAction] == ["skip", "warmup", "active", "active_and_save"]
