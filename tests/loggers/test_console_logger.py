"""ConsoleLogger: Composer's interval, first-record, fit-end and eval-progress rules, through
real Trainer runs (``log_to_console``) and through the events directly."""

from __future__ import annotations

import io
import re

import pytest
import torch

from cadence import Trainer
from cadence.core import Evaluator, State, Time
from cadence.loggers import ConsoleLogger, Logger
from cadence.loggers.console_logger import (
    NUM_EVAL_LOGGING_EVENTS,
    eval_progress_batches,
    format_value,
    progress_string,
)
from tests.common.models import SimpleModel, make_dataloader

BATCHES_PER_EPOCH = 4


def _fit(console_log_interval: str, max_duration: str, eval_interval: object = 0,
         eval_batches: int = 0) -> list[str]:
    stream = io.StringIO()
    model = SimpleModel()
    evaluators = (Evaluator(label="val", dataloader=make_dataloader(eval_batches, seed=1))
                  if eval_batches else None)
    trainer = Trainer(model=model, train_dataloader=make_dataloader(BATCHES_PER_EPOCH),
                      max_duration=max_duration, eval_dataloader=evaluators,
                      eval_interval=eval_interval, device="cpu", seed=0,
                      optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
                      progress_bar=False, log_to_console=True, console_stream=stream,
                      console_log_interval=console_log_interval, log_interval="1ba")
    trainer.fit()
    trainer.close()
    return stream.getvalue().splitlines()


def _train_records(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("[") and not line.startswith("[Eval")]


@pytest.mark.parametrize("interval,duration,expected", [
    # every batch; the first record is always printed
    ("1ba", "6ba", ["[batch=1/6]", "[batch=2/6]", "[batch=3/6]", "[batch=4/6]", "[batch=5/6]",
                    "[batch=6/6]"]),
    # every 4th batch, plus the first, plus what fit end leaves over (batch 10)
    ("4ba", "10ba", ["[batch=1/10]", "[batch=4/10]", "[batch=8/10]", "[batch=10/10]"]),
    # in epochs: epoch ends 2 and 4 (+ the first); the end of an epoch shows its last batch
    ("2ep", "3ep", ["[epoch=1][batch=4/4]", "[epoch=2][batch=4/4]", "[epoch=3][batch=4/4]"]),
    ("2ep", "4ep", ["[epoch=1][batch=4/4]", "[epoch=2][batch=4/4]", "[epoch=4][batch=4/4]"]),
    # batches, with max_duration in epochs
    ("3ba", "2ep", ["[epoch=1][batch=1/4]", "[epoch=1][batch=3/4]", "[epoch=2][batch=2/4]",
                    "[epoch=2][batch=4/4]"]),
])
def test_train_records_follow_composers_interval_rules(interval: str, duration: str,
                                                       expected: list[str]) -> None:
    lines = _fit(interval, duration)
    records = _train_records(lines)
    assert [r.rstrip(":") for r in records] == expected
    # each record lists what was logged since the last one, as "\t Train <key>: <value>"
    losses = [line for line in lines if line.startswith("\t Train loss/train/total: ")]
    assert len(losses) == len(expected)
    assert all(re.fullmatch(r"\t Train loss/train/total: \d+\.\d{4}", line) for line in losses)


def test_hparams_printed_once_before_training() -> None:
    lines = _fit("1ep", "1ep")
    assert lines.count("Config:") == 1
    start = lines.index("Config:")
    assert lines[start - 1] == "*" * 30 and "rank_zero_seed: 0" in lines[start + 1:]


def test_eval_progress_lines_and_metrics() -> None:
    lines = _fit("1ep", "1ep", eval_interval="1ep", eval_batches=12)
    progress = [line for line in lines if line.startswith("[Eval batch=")]
    # 0 %, 10 %, ... 90 % of 12 batches, then the last batch with the metrics (EVAL_END)
    assert [int(re.match(r"\[Eval batch=(\d+)/12\]", p).group(1)) for p in progress] == \
        [1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12]
    assert len(progress) == NUM_EVAL_LOGGING_EVENTS
    assert progress[0] == "[Eval batch=1/12] Eval on val data"
    assert progress[-1] == "[Eval batch=12/12] Eval on val data:"
    end = lines.index(progress[-1])
    assert re.fullmatch(r"\t Eval metrics/val/MulticlassAccuracy: \d\.\d{4}", lines[end + 1])


def test_eval_progress_batches_small_and_large() -> None:
    assert eval_progress_batches(3) == [1, 2]
    assert eval_progress_batches(0) == []
    assert eval_progress_batches(101) == [1, 11, 21, 31, 41, 51, 61, 71, 81, 91]


def test_stream_names_and_ranks(capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    model = torch.nn.Linear(2, 2)
    state = State(model=model, max_duration=Time.from_input("2ba"), dataloader_len=2)
    console = ConsoleLogger(stream="stdout")
    logger = Logger(state, [console])
    state.timestamp = state.timestamp.to_next_batch(samples=2, tokens=0)
    logger.log_metrics({"loss/train/total": torch.tensor(2.0), "lr-SGD/group0": 3e-3})
    console.batch_end(state, logger)
    assert capsys.readouterr().out.splitlines() == [
        "[batch=1/2]:", "\t Train loss/train/total: 2.0000", "\t Train lr-SGD/group0: 3.0000e-03"]
    monkeypatch.setenv("RANK", "1")
    logger.log_metrics({"loss/train/total": 1.0})
    state.timestamp = state.timestamp.to_next_batch(samples=2, tokens=0)
    console.batch_end(state, logger)
    assert capsys.readouterr().out == ""  # rank zero only
    assert progress_string(state) == "[batch=2/2]"


@pytest.mark.parametrize("bad", [0, "10sp", "0.5dur", "1e3tok", "soon"])
def test_rejects_bad_interval(bad: object) -> None:
    with pytest.raises(ValueError, match="log_interval"):
        ConsoleLogger(log_interval=bad)  # type: ignore[arg-type]


def test_int_interval_is_epochs_and_bad_stream_refused() -> None:
    assert ConsoleLogger(log_interval=2).log_interval == Time(2, "ep")
    with pytest.raises(ValueError, match="'stdin'"):
        ConsoleLogger(stream="stdin")


def test_trainer_console_arguments() -> None:
    model = SimpleModel()
    own = ConsoleLogger(stream=io.StringIO())
    with pytest.warns(UserWarning, match="console_log_interval .*ignored"):
        trainer = Trainer(model=model, loggers=[own], log_to_console=True, progress_bar=False,
                          device="cpu")
    assert [d for d in trainer.logger.destinations if isinstance(d, ConsoleLogger)] == [own]
    trainer.close()
    with pytest.raises(ValueError, match="console_stream"):
        Trainer(model=SimpleModel(), log_to_console=True, console_stream="stdin", device="cpu")


def test_format_value() -> None:
    assert format_value(torch.tensor(5.12344)) == "5.1234"
    assert format_value(3e-3) == "3.0000e-03"
    assert format_value(22.1) == "22.1000"
    assert format_value(7) == "7"
    assert format_value(float("nan")) == "nan"
    assert format_value(0.0) == "0.0"
