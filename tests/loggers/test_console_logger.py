from __future__ import annotations

import pytest
import torch

from cadence.core import State, Time
from cadence.loggers import ConsoleLogger, Logger
from cadence.loggers.console_logger import format_value


def make_state(max_duration: str = "2ep", dataloader_len: int = 4) -> State:
    model = torch.nn.Linear(2, 2)
    return State(model=model, optimizers=[torch.optim.SGD(model.parameters(), lr=0.1)],
                 max_duration=Time.from_input(max_duration), dataloader_len=dataloader_len)


def run_batches(state: State, console: ConsoleLogger, logger: Logger, n: int,
                loss_after_batch_end: bool = False) -> None:
    """Drive n batches the way the trainer does (loss logged around BATCH_END)."""
    for _ in range(n):
        console.batch_start(state, logger)
        state.timestamp = state.timestamp.to_next_batch(samples=8, tokens=512)
        loss = {"loss/train/total": torch.tensor(5.0 + int(state.timestamp.batch) / 100)}
        if not loss_after_batch_end:
            logger.log_metrics(loss)
        logger.log_metrics({"lr-SGD/group0": 3e-3})  # a callback at BATCH_END
        console.batch_end(state, logger)
        if loss_after_batch_end:
            logger.log_metrics(loss)
        if state.timestamp.batch_in_epoch == state.dataloader_len:
            state.timestamp = state.timestamp.to_next_epoch()
            console.epoch_end(state, logger)


@pytest.mark.parametrize("loss_after_batch_end", [False, True])
def test_prints_every_interval_as_plain_lines(capsys: pytest.CaptureFixture[str],
                                              loss_after_batch_end: bool) -> None:
    state = make_state()
    console = ConsoleLogger(log_interval=3)
    logger = Logger(state, [console])
    console.fit_start(state, logger)
    run_batches(state, console, logger, 8, loss_after_batch_end)
    console.fit_end(state, logger)
    console.close()
    console.close()
    out = capsys.readouterr().out
    assert "\r" not in out
    lines = out.splitlines()
    assert lines == [
        # the first step is always printed, so the run shows where its loss started
        "[epoch 1/2][batch 1/8] loss/train/total: 5.0100, lr-SGD/group0: 3.0000e-03",
        "[epoch 1/2][batch 3/8] loss/train/total: 5.0300, lr-SGD/group0: 3.0000e-03",
        "[epoch 2/2][batch 6/8] loss/train/total: 5.0600, lr-SGD/group0: 3.0000e-03",
        # fit_end prints what the last interval left over
        "[epoch 2/2][batch 8/8] loss/train/total: 5.0800, lr-SGD/group0: 3.0000e-03",
    ]


def test_eval_metrics_always_printed(capsys: pytest.CaptureFixture[str]) -> None:
    state = make_state()
    console = ConsoleLogger(log_interval="100ba")
    logger = Logger(state, [console])
    console.fit_start(state, logger)
    run_batches(state, console, logger, 2)
    console.eval_before_all(state, logger)
    logger.log_metrics({"metrics/eval/LanguagePerplexity": torch.tensor(123.45),
                        "metrics/eval/LanguageCrossEntropy": 4.8158})
    console.close()
    out = capsys.readouterr().out
    assert out.splitlines()[1:] == [
        "[eval][batch 2] metrics/eval/LanguagePerplexity: 123.4500, "
        "metrics/eval/LanguageCrossEntropy: 4.8158"
    ]


def test_epoch_interval(capsys: pytest.CaptureFixture[str]) -> None:
    state = make_state("3ep", dataloader_len=2)
    console = ConsoleLogger(log_interval="2ep")
    logger = Logger(state, [console])
    console.fit_start(state, logger)
    run_batches(state, console, logger, 4)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("[epoch 2/3][batch 4/6] loss/train/total: 5.0400")


def test_batch_max_duration_totals(capsys: pytest.CaptureFixture[str]) -> None:
    state = make_state("10ba", dataloader_len=4)
    console = ConsoleLogger(log_interval=5)
    logger = Logger(state, [console])
    console.fit_start(state, logger)
    run_batches(state, console, logger, 6)
    assert capsys.readouterr().out.splitlines()[1].startswith("[epoch 2/3][batch 5/10] ")


def test_silent_off_rank_zero(capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    state = make_state()
    console = ConsoleLogger(log_interval=1)
    logger = Logger(state, [console])
    console.fit_start(state, logger)
    run_batches(state, console, logger, 3)
    logger.log_metrics({"metrics/eval/Accuracy": 0.5})
    console.fit_end(state, logger)
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("bad", [0, "10sp", "0.5dur", "1e3tok"])
def test_rejects_bad_interval(bad: object) -> None:
    with pytest.raises(ValueError, match="log_interval"):
        ConsoleLogger(log_interval=bad)  # type: ignore[arg-type]


def test_format_value() -> None:
    assert format_value(torch.tensor(5.12344)) == "5.1234"
    assert format_value(3e-3) == "3.0000e-03"
    assert format_value(22.1) == "22.1000"
    assert format_value(7) == "7"
    assert format_value(float("nan")) == "nan"
    assert format_value(0.0) == "0.0"
