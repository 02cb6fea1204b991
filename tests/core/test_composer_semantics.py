"""Composer's semantics where cadence used to differ (issue 20, item 8): one test each,
through the public API."""

from __future__ import annotations

import os
import random
import re
import time
import warnings
from pathlib import Path
from typing import Any
from unittest.mock import Mock

import pytest
import torch
import torchmetrics

from cadence import Callback, Evaluator, Event, Trainer
from cadence.optim import CosineAnnealingWithWarmupScheduler, LinearWithWarmupScheduler
from cadence.utils import dist, reproducibility
from tests.common.models import SimpleModel, make_dataloader


class EvalCount(Callback):
    def __init__(self) -> None:
        self.evals = 0

    def eval_start(self, state: Any, logger: Any) -> None:
        self.evals += 1


def trainer(**kwargs: Any) -> Trainer:
    kwargs.setdefault("train_dataloader", make_dataloader(num_batches=2))
    kwargs.setdefault("max_duration", "2ba")
    return Trainer(model=kwargs.pop("model", SimpleModel()), seed=0, progress_bar=False, **kwargs)


@pytest.mark.parametrize("where", ["trainer", "evaluator"])
def test_eval_interval_zero_disables_evaluation(where: str) -> None:
    count = EvalCount()
    loader = make_dataloader(num_batches=1, seed=1)
    kwargs: dict[str, Any] = (
        {"eval_dataloader": loader, "eval_interval": 0} if where == "trainer"
        else {"eval_dataloader": Evaluator(label="eval", dataloader=loader, eval_interval=0)})
    run = trainer(callbacks=[count], **kwargs)
    run.fit()  # not even at the end of training
    assert count.evals == 0 and int(run.state.timestamp.batch) == 2
    run.close()


def test_rerunning_a_finished_autoresume_run_raises(tmp_path: Path) -> None:
    def run() -> Trainer:
        return trainer(run_name="done", save_folder=str(tmp_path), autoresume=True)

    first = run()
    first.fit()
    first.close()
    again = run()  # resumes the checkpoint written at the end: batch 2 of 2
    assert int(again.state.timestamp.batch) == 2
    with pytest.raises(ValueError, match=re.escape(
            "The max_duration (2ba) is less than or equal to the elapsed training duration "
            "(2ba). No training would occur.")):
        again.fit()
    again.fit(duration="1ba")  # Composer's way on: one batch more
    assert int(again.state.timestamp.batch) == 3
    again.close()


class TwoMetrics(SimpleModel):
    def get_metrics(self, is_train: bool = False) -> dict[str, Any]:
        return {"MulticlassAccuracy": torchmetrics.classification.MulticlassAccuracy(num_classes=3),
                "MulticlassF1Score": torchmetrics.classification.MulticlassF1Score(num_classes=3)}


def test_evaluator_metric_names_are_regex_filters() -> None:
    loader = make_dataloader(num_batches=1, seed=1)
    run = trainer(model=TwoMetrics(), eval_dataloader=[
        Evaluator(label="f1", dataloader=loader, metric_names=["f1"]),
        Evaluator(label="both", dataloader=loader, metric_names=["Multiclass.*"]),
    ])
    assert list(run.state.eval_metrics["f1"]) == ["MulticlassF1Score"]  # case-insensitive search
    assert sorted(run.state.eval_metrics["both"]) == ["MulticlassAccuracy", "MulticlassF1Score"]
    results = run.eval()
    assert set(results) == {"metrics/f1/MulticlassF1Score", "metrics/both/MulticlassAccuracy",
                            "metrics/both/MulticlassF1Score"}
    run.close()
    with pytest.raises(ValueError, match=r"'typo'.*asks for metrics \['Recall'\]"):
        trainer(model=TwoMetrics(), eval_dataloader=Evaluator(
            label="typo", dataloader=loader, metric_names=["Recall"]))
    with pytest.raises(ValueError, match="metric_names must be a list"):
        Evaluator(label="eval", dataloader=loader, metric_names="MulticlassAccuracy")


def test_engine_takes_any_object_with_match_and_apply() -> None:
    algorithm = Mock()  # every attribute is a Mock: no `events`, truthy `interpolate_loss`
    algorithm.match.side_effect = lambda event, state: event == Event.BATCH_START
    run = trainer(algorithms=[algorithm, Mock(**{"match.return_value": False})])
    run.fit()
    asked = {call.args[0] for call in algorithm.match.call_args_list}
    assert {Event.INIT, Event.BATCH_START, Event.AFTER_BACKWARD, Event.FIT_END} <= asked
    applied = [call.args[0] for call in algorithm.apply.call_args_list]
    assert applied == [Event.BATCH_START, Event.BATCH_START]  # one per batch
    run.close()


class BatchEditor(Callback):
    """Zeroes the targets through State.batch_set_item and stops after the first batch."""

    def __init__(self) -> None:
        self.targets: list[torch.Tensor] = []

    def after_dataloader(self, state: Any, logger: Any) -> None:
        targets = state.batch_get_item(1)
        state.batch_set_item(1, torch.zeros_like(targets))  # a tuple batch: replaced
        self.targets.append(state.batch_get_item(key=1))

    def batch_end(self, state: Any, logger: Any) -> None:
        state.stop_training()


class Extra:
    def __init__(self, value: int) -> None:
        self.value = value

    def state_dict(self) -> dict[str, int]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.value = state["value"]


def test_state_batch_items_stop_training_and_serialized_attributes() -> None:
    editor = BatchEditor()
    run = trainer(callbacks=[editor], max_duration="1ep")
    run.fit()
    assert int(run.state.timestamp.batch) == 1  # stop_training() after the first batch
    assert len(editor.targets) == 1 and not editor.targets[0].any()
    state = run.state
    assert {"model", "optimizers", "schedulers", "timestamp", "rank_zero_seed"} <= set(
        state.serialized_attributes)
    state.extra = Extra(7)
    state.serialized_attributes.append("extra")
    saved = state.state_dict()
    assert saved["extra"] == {"value": 7}
    state.extra.value = 0
    state.load_state_dict(saved)
    assert state.extra.value == 7
    run.close()


@pytest.mark.parametrize("scheduler, match", [
    (CosineAnnealingWithWarmupScheduler(t_warmup="1ba", t_max="2ba"),
     "t_max 2ba must be greater than or equal to max_duration 4ba"),
    (LinearWithWarmupScheduler(t_warmup="8sp"), "Cannot use warmup scheduler with t_max 4ba"),
])
def test_warmup_scheduler_that_cannot_cover_max_duration_fails_before_training(
        scheduler: Any, match: str) -> None:
    run = trainer(max_duration=None)
    with pytest.raises(ValueError, match=match):
        run.fit(schedulers=scheduler, duration="4ba")
    assert int(run.state.timestamp.batch) == 0
    run.close()


def test_reproducibility_helpers() -> None:
    torch.manual_seed(3)
    seed = reproducibility.get_random_seed()
    torch.manual_seed(3)
    assert reproducibility.get_random_seed() == seed and 0 <= seed < 2**32
    reproducibility.seed_all(seed)
    first = (random.random(), torch.rand(2))
    reproducibility.seed_all(seed)
    assert first[0] == random.random() and torch.equal(first[1], torch.rand(2))
    before, env = torch.are_deterministic_algorithms_enabled(), os.environ.copy()
    try:
        with pytest.warns(UserWarning, match="Deterministic mode is activated"):
            reproducibility.configure_deterministic_mode()
        assert torch.are_deterministic_algorithms_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert torch.backends.cudnn.benchmark is False
    finally:
        torch.use_deterministic_algorithms(before)
        os.environ.clear()
        os.environ.update(env)


def test_node_signal_file_name() -> None:
    name = dist.get_node_signal_file_name(random.Random(0))
    assert re.fullmatch(r"\._signal_file_node0_[A-Za-z0-9]{6}", name)
    assert name == dist.get_node_signal_file_name(random.Random(0))
    assert name != dist.get_node_signal_file_name(random.Random(1))


@pytest.mark.slow  # two processes: ~25 s on a loaded machine
@pytest.mark.world_size(2)
def test_busy_wait_for_local_rank_zero(tmp_path: Path) -> None:
    folder = tmp_path / "shared"
    folder.mkdir(exist_ok=True)
    made = folder / "made-by-rank-0"
    with warnings.catch_warnings():
        with dist.busy_wait_for_local_rank_zero(str(folder)):
            if dist.get_local_rank() == 0:
                time.sleep(0.5)  # rank 1 must wait for this
                made.write_text("done")
    assert made.read_text() == "done"  # rank 1 got here only after rank 0 left the block
    dist.barrier()
    assert [p.name for p in folder.iterdir()] == ["made-by-rank-0"]  # signal file removed


def test_batch_get_and_set_take_a_list_of_slices_into_a_tensor_without_torchs_warning() -> None:
    """Composer's ``batch_get(t, [slice(2, 4), slice(1, 3)])`` is ``t[2:4, 1:3]``; torch
    deprecates (warns on) a list holding slices as an index, so it is read as the tuple."""
    import warnings

    import numpy as np
    import torch

    from cadence.utils.batch_helpers import batch_get, batch_set

    t = torch.arange(15).reshape(5, 3)
    key = [slice(2, 4), slice(1, 3)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert batch_get(t, key).tolist() == [[7, 8], [10, 11]]
        out = batch_set(t, key, torch.tensor([[0, 0], [0, 0]]))
        assert out is t and t[2:4, 1:3].sum() == 0 and t.sum() == 105 - 36
        assert batch_get(np.arange(6).reshape(2, 3), [slice(None), 1]).tolist() == [1, 4]
    assert batch_get(t, [0, 1]).tolist() == [[0, 1, 2], [3, 4, 5]]  # rows, as before
