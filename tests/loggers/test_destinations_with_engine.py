"""All built-in destinations and monitors driven through the Engine in loop order."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

from cadence.callbacks import LRMonitor, SpeedMonitor
from cadence.core import Engine, Event, Evaluator, State, Time, Timestamp
from cadence.loggers import (
    ConsoleLogger,
    FileLogger,
    InMemoryLogger,
    Logger,
    ProgressBarLogger,
)


def test_loop_through_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = torch.nn.Linear(2, 2)
    state = State(model=model, optimizers=[torch.optim.AdamW(model.parameters(), lr=3e-3)],
                  max_duration=Time(2, "ep"), dataloader_len=3, run_name="engine-run",
                  evaluators=[Evaluator(label="eval", dataloader=[0, 1])],
                  callbacks=[LRMonitor(), SpeedMonitor(window_size=2)])
    memory = InMemoryLogger()
    file_logger = FileLogger(folder=str(tmp_path / "{run_name}"))
    bar = ProgressBarLogger(stream=io.StringIO())
    destinations = [ConsoleLogger(log_interval="2ba", stream="stdout"), file_logger, bar, memory]
    logger = Logger(state, destinations)
    engine = Engine(state, logger, destinations=destinations)

    engine.run_event(Event.INIT)
    logger.log_hyperparameters({"lr": 3e-3})
    engine.run_event(Event.FIT_START)
    for _ in range(2):
        engine.run_event(Event.EPOCH_START)
        for _ in range(3):
            engine.run_event(Event.BATCH_START)
            state.timestamp = state.timestamp.to_next_batch(samples=4, tokens=64)
            logger.log_metrics({"loss/train/total": torch.tensor(1.0)})
            engine.run_event(Event.BATCH_END)
            engine.run_event(Event.BATCH_CHECKPOINT)
        state.timestamp = state.timestamp.to_next_epoch()
        engine.run_event(Event.EPOCH_END)
        engine.run_event(Event.EVAL_BEFORE_ALL)
        spec = state.evaluators[0].dataloader  # a DataSpec, as in Composer
        state.set_dataloader(getattr(spec, "dataloader", spec), "eval")  # as the trainer does
        state.eval_timestamp = Timestamp()
        engine.run_event(Event.EVAL_START)
        for _ in range(2):
            engine.run_event(Event.EVAL_BATCH_START)
            state.eval_timestamp = state.eval_timestamp.to_next_batch(samples=1)
            engine.run_event(Event.EVAL_BATCH_END)
        logger.log_metrics({"metrics/eval/LanguagePerplexity": torch.tensor(3.0)})
        engine.run_event(Event.EVAL_END)
        state.set_dataloader(None)
        state.dataloader_len = 3
        engine.run_event(Event.EVAL_AFTER_ALL)
        engine.run_event(Event.EPOCH_CHECKPOINT)
    engine.run_event(Event.FIT_END)
    engine.close()
    engine.close()
    for destination in destinations:
        destination.close()  # a second close is safe

    steps, lrs = memory.steps_and_values("lr-AdamW/group0")
    assert (steps[-1], lrs[-1]) == (6, pytest.approx(3e-3))
    assert "throughput/samples_per_sec" in memory.most_recent_values
    assert len(memory.data["time/train"]) == 6
    records = [json.loads(line) for line in
               (tmp_path / "engine-run" / "metrics.jsonl").read_text().splitlines()]
    assert {"step", "loss/train/total"} <= set(records[0])
    assert json.loads((tmp_path / "engine-run" / "hparams.json").read_text()) == {"lr": 3e-3}
    out = capsys.readouterr().out
    assert "\r" not in out
    lines = out.splitlines()
    # Composer's records: the first batch, every 2nd, each metric on its own line
    assert lines[lines.index("Config:") + 1] == "lr: 0.003"
    assert lines[lines.index("[epoch=1][batch=1/3]:") + 1] == "\t Train loss/train/total: 1.0000"
    assert [line for line in lines if line.startswith("[epoch=")] == [
        "[epoch=1][batch=1/3]:", "[epoch=1][batch=2/3]:", "[epoch=2][batch=1/3]:",
        "[epoch=2][batch=3/3]:"]
    assert lines.count("[Eval batch=1/2] Eval on eval data") == 2
    assert lines.count("[Eval batch=2/2] Eval on eval data:") == 2
    assert lines.count("\t Eval metrics/eval/LanguagePerplexity: 3.0000") == 2
    assert "epoch 2/2" in bar.stream.getvalue()  # type: ignore[attr-defined]
