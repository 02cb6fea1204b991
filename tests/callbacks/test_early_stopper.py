from __future__ import annotations

from typing import Any, Optional, Sequence

import pytest
import torch
import torchmetrics

from cadence import State, Time, Trainer
from cadence.callbacks import EarlyStopper, ThresholdStopper
from cadence.callbacks.metric_watcher import lower_is_better
from cadence.loggers import InMemoryLogger, Logger
from tests.common.models import SimpleModel, make_dataloader


class Scripted(torchmetrics.Metric):
    """A metric whose ``compute`` returns the next value of a script, once per evaluation
    (torchmetrics caches the result until the next ``update``/``reset``)."""

    full_state_update = False

    def __init__(self, script: Sequence[float]) -> None:
        super().__init__()
        self.script = list(script)
        self.computed = 0
        self.add_state("updates", default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, *args: Any) -> None:
        self.updates += 1

    def compute(self) -> torch.Tensor:
        value = self.script[min(self.computed, len(self.script) - 1)]
        self.computed += 1
        return torch.tensor(value)


class ScriptedModel(SimpleModel):
    """SimpleModel whose eval metric ``Score`` follows ``script`` (one value per evaluation)."""

    def __init__(self, script: Sequence[float]) -> None:
        super().__init__()
        self.script = script

    def get_metrics(self, is_train: bool = False) -> dict[str, Any]:
        return {**super().get_metrics(is_train), "Score": Scripted(self.script)}

    def update_metric(self, batch: Any, outputs: Any, metric: Any) -> None:
        if isinstance(metric, Scripted):
            metric.update()
        else:
            super().update_metric(batch, outputs, metric)


def fit(script: Sequence[float], callback: Any, max_duration: str = "10ba") -> Trainer:
    trainer = Trainer(model=ScriptedModel(script), train_dataloader=make_dataloader(10),
                      eval_dataloader=make_dataloader(1, seed=1), eval_interval="1ba",
                      max_duration=max_duration, seed=0, progress_bar=False,
                      callbacks=[callback])
    trainer.fit()
    trainer.close()
    return trainer


# -- hand-driven: a sequence of evaluations --------------------------------------------------
class Value:
    """A stand-in metric: ``compute`` returns what the test set."""

    def __init__(self) -> None:
        self.value = 0.0

    def compute(self) -> torch.Tensor:
        return torch.tensor(self.value)


def drive(stopper: Any, values: Sequence[float], monitor: str = "Score",
          label: str = "eval", batches_per_eval: int = 1) -> Optional[int]:
    """Feed ``values`` as one evaluation each; return the (1-based) evaluation that stopped."""
    metric = Value()
    state = State(model=torch.nn.Linear(1, 1), max_duration=Time(100, "ba"),
                  eval_metrics={label: {monitor: metric}})
    logger = Logger(state, [InMemoryLogger()])
    stopper.fit_start(state, logger)
    for index, value in enumerate(values, start=1):
        for _ in range(batches_per_eval):
            state.timestamp = state.timestamp.to_next_batch(samples=4)
        metric.value = value
        stopper.eval_after_all(state, logger)
        if state.stop_training:
            return index
    return None


@pytest.mark.parametrize(("values", "patience", "stopped_at"), [
    ([3.0, 2.0, 2.5, 2.4, 1.0], 2, 4),  # best 2.0 at eval 2; evals 3 and 4 do not improve
    ([3.0, 2.0, 2.5, 1.0, 1.5], 2, None),  # eval 4 improves: the count restarts
    ([3.0, 3.0], 1, 2),  # equal is not better
    ([3.0, 2.0, 1.0, 0.5], 1, None),
])
def test_int_patience_counts_evaluations(values: list[float], patience: int,
                                         stopped_at: Optional[int]) -> None:
    stopper = EarlyStopper("Score", comp="<", patience=patience)
    assert drive(stopper, values) == stopped_at


def test_min_delta_ignores_small_improvements() -> None:
    stopper = EarlyStopper("LanguagePerplexity", min_delta=0.5, patience=2)
    assert drive(stopper, [10.0, 9.8, 9.7, 9.0], monitor="LanguagePerplexity") == 3
    assert stopper.best == 10.0


def test_time_patience_follows_composer() -> None:
    # An eval every 2 batches; best at batch 4 (eval 2). Batch 8 is exactly 4 batches
    # later (not more): go on; batch 10 is 6 later: stop at eval 5.
    values = [5.0, 4.0, 4.5, 4.5]
    stopper = EarlyStopper("CrossEntropyLoss", patience="4ba")
    assert drive(stopper, values, monitor="CrossEntropyLoss", batches_per_eval=2) is None
    stopper = EarlyStopper("CrossEntropyLoss", patience="4ba")
    assert drive(stopper, [*values, 4.5], monitor="CrossEntropyLoss", batches_per_eval=2) == 5
    # 'dur' is relative to max_duration (100ba): 0.03dur = 3 batches.
    stopper = EarlyStopper("CrossEntropyLoss", patience="0.03dur")
    assert drive(stopper, [5.0, 5.0, 5.0, 5.0, 5.0], monitor="CrossEntropyLoss") == 5


def test_direction_by_name() -> None:
    for name in ("loss", "LanguageCrossEntropy", "LanguagePerplexity", "MeanSquaredError"):
        assert lower_is_better(name)
    for name in ("MulticlassAccuracy", "F1Score"):
        assert not lower_is_better(name)
    # Accuracy goes up, so a drop does not improve it.
    assert drive(EarlyStopper("MulticlassAccuracy", patience=1), [0.5, 0.6, 0.55],
                 monitor="MulticlassAccuracy") == 3


def test_state_dict_carries_the_wait_across_a_resumption() -> None:
    first = EarlyStopper("Score", comp="<", patience=3)
    assert drive(first, [2.0, 1.0, 1.5, 1.5]) is None  # two evals without improvement
    second = EarlyStopper("Score", comp="<", patience=3)
    second.load_state_dict(first.state_dict())
    assert second.best == 1.0 and second.checks_since_best == 2
    assert drive(second, [1.5]) == 1  # the third one stops


def test_train_metric_with_batch_patience_checks_every_batch() -> None:
    metric = Value()
    state = State(model=torch.nn.Linear(1, 1), train_metrics={"MulticlassAccuracy": metric})
    logger = Logger(state, [InMemoryLogger()])
    stopper = EarlyStopper("MulticlassAccuracy", "train", patience="2ba")
    stopper.fit_start(state, logger)
    for batch, value in enumerate([0.5, 0.4, 0.4, 0.4], start=1):
        state.timestamp = state.timestamp.to_next_batch(samples=4)
        metric.value = value
        stopper.batch_end(state, logger)
        stopper.epoch_end(state, logger)  # checked on batches, not epochs, with 'ba' patience
        if state.stop_training:
            break
    assert batch == 4


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"comp": "=="}, "comp"), ({"min_delta": -1.0}, "min_delta"), ({"patience": 0}, "patience"),
    ({"patience": "0ep"}, "patience"), ({"patience": "soon"}, "Invalid time string"),
])
def test_rejects_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        EarlyStopper("Score", **kwargs)


def test_fit_start_names_what_the_run_has() -> None:
    state = State(model=torch.nn.Linear(1, 1), eval_metrics={"eval": {"Score": Value()}})
    logger = Logger(state, [])
    with pytest.raises(ValueError, match=r"labelled 'val'.*\['train', 'eval'\]"):
        EarlyStopper("Score", "val").fit_start(state, logger)
    with pytest.raises(ValueError, match=r"'Scroe' is not computed for 'eval'.*\['Score'\]"):
        ThresholdStopper("Scroe", "eval", threshold=1.0).fit_start(state, logger)


def test_threshold_stopper_by_hand() -> None:
    assert drive(ThresholdStopper("MulticlassAccuracy", "eval", threshold=0.9),
                 [0.5, 0.89, 0.9, 0.95], monitor="MulticlassAccuracy") == 3
    assert drive(ThresholdStopper("LanguagePerplexity", "eval", threshold=20.0),
                 [50.0, 30.0, 19.0], monitor="LanguagePerplexity") == 3
    assert drive(ThresholdStopper("Score", "eval", threshold=1.0, comp=">"),
                 [1.0, 1.0]) is None
    stopper = ThresholdStopper("Score", "eval", threshold=1.0)
    drive(stopper, [0.25])
    assert stopper.state_dict() == {"last_value": 0.25}
    with pytest.raises(ValueError, match="finite"):
        ThresholdStopper("Score", "eval", threshold=float("nan"))


def test_threshold_stopper_on_a_train_metric_per_batch_or_epoch() -> None:
    # (batch, epoch) when it stopped: after batch 1, or at the end of the epoch.
    for stop_on_batch, expected in ((True, (1, 0)), (False, (2, 1))):
        metric = Value()
        metric.value = 1.0
        state = State(model=torch.nn.Linear(1, 1), train_metrics={"MulticlassAccuracy": metric})
        logger = Logger(state, [])
        stopper = ThresholdStopper("MulticlassAccuracy", "train", 0.5, stop_on_batch=stop_on_batch)
        stopper.fit_start(state, logger)
        for _ in range(2):  # an epoch of two batches
            state.timestamp = state.timestamp.to_next_batch(samples=4)
            stopper.batch_end(state, logger)
            if state.stop_training:
                break
        else:
            state.timestamp = state.timestamp.to_next_epoch()
            stopper.epoch_end(state, logger)
        assert state.stop_training
        assert (state.timestamp.batch, state.timestamp.epoch) == expected


# -- real runs: eval after every batch ---------------------------------------------------------
def test_early_stopper_ends_a_real_run_at_the_right_batch() -> None:
    # Score improves until eval 3 (batch 3), then not; patience 2 evals: stop after batch 5.
    stopper = EarlyStopper("Score", comp=">", patience=2)
    trainer = fit([0.1, 0.2, 0.3, 0.3, 0.25, 0.9], stopper)
    assert trainer.state.timestamp.batch == 5
    assert stopper.best == pytest.approx(0.3)


def test_threshold_stopper_ends_a_real_run_at_the_right_batch() -> None:
    stopper = ThresholdStopper("Score", "eval", threshold=0.9)
    memory = InMemoryLogger()
    trainer = Trainer(model=ScriptedModel([0.1, 0.5, 0.95, 0.2]),
                      train_dataloader=make_dataloader(10),
                      eval_dataloader=make_dataloader(1, seed=1), eval_interval="1ba",
                      max_duration="10ba", seed=0, progress_bar=False,
                      callbacks=[stopper], loggers=[memory])
    trainer.fit()
    trainer.close()
    assert trainer.state.timestamp.batch == 3
    steps, values = memory.steps_and_values("metrics/eval/Score")
    assert values == pytest.approx([0.1, 0.5, 0.95])  # the trainer logged what was checked
