"""``fit_changes``: fit()'s arguments as typed changes, computed without writing anything;
``grad_scaler_for``: the one place a GradScaler is built."""

from __future__ import annotations

import pytest
import torch

from cadence import State, Time, TimeUnit, Timestamp
from cadence.trainer.fit_args import FitChanges, fit_changes
from cadence.trainer.trainer_options import grad_scaler_for
from tests.common.models import SimpleModel, make_dataloader


def _state(**kwargs: object) -> State:
    state = State(model=SimpleModel(), run_name="run", max_duration="4ba",
                  train_dataloader=make_dataloader(num_batches=4), dataloader_label="train",
                  **kwargs)
    state.timestamp = Timestamp(epoch=1, batch=5)
    return state


def test_no_arguments_change_nothing() -> None:
    state = _state()
    state.max_duration = "8ba"  # not yet reached: fit() past max_duration raises (Composer's)
    changes = fit_changes(state)
    assert changes == FitChanges(max_duration=state.max_duration)
    changes.apply_to_state(state)
    assert state.max_duration == Time(8, TimeUnit.BATCH) and int(state.timestamp.batch) == 5


def test_changes_are_computed_without_writing_the_state() -> None:
    state = _state()
    loader = make_dataloader(num_batches=6)
    changes = fit_changes(state, train_dataloader=loader, train_dataloader_label="mine",
                          train_subset_num_batches=3, duration="2ba", eval_dataloader=loader,
                          eval_interval="2ba", device_train_microbatch_size="auto",
                          precision="amp_bf16", step_schedulers_every_batch=False)
    assert state.train_dataloader is not loader and state.max_duration.value == 4  # unchanged
    assert changes.train_dataloader is loader and changes.train_dataloader_label == "mine"
    assert changes.set_dataloader_len and changes.dataloader_len == 3
    assert changes.max_duration == Time(7, TimeUnit.BATCH)  # 2 more than the 5 done
    assert [e.label for e in changes.evaluators] == ["eval"]
    assert changes.eval_interval == Time(2, TimeUnit.BATCH)
    assert changes.auto_microbatch is True and changes.device_train_microbatch_size is None
    assert changes.precision == "amp_bf16" and changes.step_schedulers_every_batch is False
    changes.apply_to_state(state)
    assert state.train_dataloader is loader and state.dataloader_label == "mine"
    assert int(state.dataloader_len) == 3 and state.max_duration == Time(7, TimeUnit.BATCH)
    assert state.precision == "amp_bf16" and state.device_train_microbatch_size is None


def test_reset_time_and_scale_schedule_ratio() -> None:
    state = _state()
    changes = fit_changes(state, duration="3ep", reset_time=True, scale_schedule_ratio=2.0)
    assert changes.max_duration == Time(6, TimeUnit.EPOCH)  # 3 from 0, scaled by 2
    changes.apply_to_state(state)
    assert int(state.timestamp.batch) == 0 and state.previous_timestamp is None


@pytest.mark.parametrize("kwargs, match", [
    ({"duration": "0.5dur"}, "cannot be in 'dur'"),
    ({"device_train_microbatch_size": 0}, "positive int or 'auto'"),
    ({"scale_schedule_ratio": 0.0}, "scale_schedule_ratio must be > 0"),
    ({"precision": "fp8"}, "not one of"),
])
def test_bad_arguments_are_refused_before_any_change(kwargs: dict, match: str) -> None:
    state = _state()
    with pytest.raises(ValueError, match=match):
        fit_changes(state, train_dataloader=make_dataloader(num_batches=2), **kwargs)
    assert len(state.train_dataloader) == 4


def test_a_duration_is_needed() -> None:
    state = State(model=SimpleModel(), run_name="run")
    with pytest.raises(ValueError, match="fit\\(\\) needs a duration"):
        fit_changes(state)


def test_grad_scaler_only_for_fp16() -> None:
    cpu = torch.device("cpu")
    assert isinstance(grad_scaler_for("amp_fp16", cpu), torch.amp.GradScaler)
    assert grad_scaler_for("amp_bf16", cpu) is None and grad_scaler_for("fp32", cpu) is None
    with pytest.raises(ValueError, match="not one of"):
        grad_scaler_for("fp8", cpu)
