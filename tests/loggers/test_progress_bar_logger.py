from __future__ import annotations

import io
import sys

import pytest
import torch

from cadence.core import Evaluator, State, Time
from cadence.loggers import (
    ConsoleLogger,
    Logger,
    ProgressBarLogger,
    default_progress_destination,
)


def make_state(max_duration: str = "2ep", dataloader_len: int = 3) -> State:
    model = torch.nn.Linear(2, 2)
    return State(model=model, optimizers=[torch.optim.SGD(model.parameters(), lr=0.1)],
                 max_duration=Time.from_input(max_duration), dataloader_len=dataloader_len,
                 evaluators=[Evaluator(label="val", dataloader=[0, 1])])


def run_epoch(state: State, bar: ProgressBarLogger, logger: Logger, n: int) -> None:
    bar.epoch_start(state, logger)
    for _ in range(n):
        state.timestamp = state.timestamp.to_next_batch(samples=8, tokens=512)
        logger.log_metrics({"loss/train/total": torch.tensor(4.25), "lr-SGD/group0": 0.1,
                            "throughput/samples_per_sec": 22.123, "other": 1})
        bar.batch_end(state, logger)
    state.timestamp = state.timestamp.to_next_epoch()
    bar.epoch_end(state, logger)


def test_train_and_eval_bars() -> None:
    stream = io.StringIO()
    state = make_state()
    bar = ProgressBarLogger(stream=stream)
    logger = Logger(state, [bar])
    bar.fit_start(state, logger)
    run_epoch(state, bar, logger, 3)
    bar.eval_before_all(state, logger)
    bar.eval_start(state, logger)
    for _ in range(2):
        bar.eval_batch_end(state, logger)
    logger.log_metrics({"metrics/val/Accuracy": torch.tensor(0.75)})
    bar.eval_end(state, logger)
    bar.fit_end(state, logger)
    bar.close()
    bar.close()
    out = stream.getvalue()
    assert "epoch 1/2" in out
    assert "3/3" in out
    assert "loss=4.2500" in out and "lr=0.1000" in out and "samples/s=22.1" in out
    assert "other" not in out
    assert "[eval][batch 3] metrics/val/Accuracy: 0.7500" in out
    assert "val" in out and "2/2" in out


def test_more_batches_than_announced_does_not_warn() -> None:
    stream = io.StringIO()
    state = make_state(dataloader_len=2)
    bar = ProgressBarLogger(stream=stream)
    logger = Logger(state, [bar])
    run_epoch(state, bar, logger, 4)  # filterwarnings=error: a tqdm warning would fail here
    bar.close()
    assert "4/4" in stream.getvalue()


def test_batch_duration_one_bar_for_the_whole_run() -> None:
    """As Composer: max_duration not in epochs gives one bar over the run, in its unit."""
    stream = io.StringIO()
    state = make_state("5ba", dataloader_len=3)
    bar = ProgressBarLogger(stream=stream)
    logger = Logger(state, [bar])
    run_epoch(state, bar, logger, 3)
    assert bar._train_bar is not None and bar._train_bar.n == 3  # stays open across epochs
    run_epoch(state, bar, logger, 2)
    bar.fit_end(state, logger)
    bar.close()
    out = stream.getvalue()
    assert "train" in out and "5/5" in out and "epoch" not in out


def test_hparams_printed_once_and_stream_names(capsys: pytest.CaptureFixture[str]) -> None:
    state = make_state()
    bar = ProgressBarLogger(stream="stdout")
    logger = Logger(state, [bar])
    logger.log_hyperparameters({"lr": 0.5, "model": "gpt"})
    bar.fit_start(state, logger)
    bar.eval_start(state, logger)
    bar.eval_end(state, logger)
    bar.close()
    out = capsys.readouterr().out
    assert out.count("Config:") == 1 and "lr: 0.5" in out and "model: gpt" in out
    with pytest.raises(ValueError, match="'stdin'"):
        ProgressBarLogger(stream="stdin")


def test_silent_off_rank_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    stream = io.StringIO()
    state = make_state()
    bar = ProgressBarLogger(stream=stream)
    logger = Logger(state, [bar])
    run_epoch(state, bar, logger, 3)
    bar.eval_start(state, logger)
    bar.eval_batch_end(state, logger)
    logger.log_metrics({"metrics/val/Accuracy": 0.5})
    bar.eval_end(state, logger)
    bar.close()
    assert stream.getvalue() == ""


class _Stdout(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


def test_default_progress_destination(monkeypatch: pytest.MonkeyPatch) -> None:
    assert default_progress_destination(False) is None
    monkeypatch.setattr(sys, "stderr", _Stdout(tty=True))
    assert isinstance(default_progress_destination(True), ProgressBarLogger)  # stderr default
    monkeypatch.setattr(sys, "stdout", _Stdout(tty=False))
    console = default_progress_destination(True, console_log_interval="5ba", stream="stdout")
    assert isinstance(console, ConsoleLogger)
    assert console.log_interval == Time(5, "ba")
    assert ProgressBarLogger.is_progress and ConsoleLogger.is_progress
