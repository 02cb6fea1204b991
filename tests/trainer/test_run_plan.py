"""What the loop decides once instead of per step (issue 30, item 5): the precision context
built once per precision, the default DataSpec transforms skipped, the batch's shapes read
only when an algorithm may reshape it, its samples read once; the counts as before."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from cadence import Algorithm, DataSpec, Event, Trainer
from cadence.core.data_spec import no_transform
from cadence.trainer import run_plan
from cadence.trainer import trainer as trainer_module
from tests.common.models import SimpleModel, make_dataloader


class _Counter:
    def __init__(self, function: Any) -> None:
        self.function, self.calls = function, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.function(*args, **kwargs)


def _trainer(train_dataloader: Any, **kwargs: Any) -> Trainer:
    model = SimpleModel()
    return Trainer(model=model, train_dataloader=train_dataloader, device="cpu", seed=0,
                   optimizers=torch.optim.SGD(model.parameters(), lr=0.1), progress_bar=False,
                   **kwargs)


def test_precision_context_built_once_per_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    counter = _Counter(run_plan.get_precision_context)
    monkeypatch.setattr(run_plan, "get_precision_context", counter)
    trainer = _trainer(make_dataloader(4), max_duration="4ba", device_train_microbatch_size=2)
    trainer.fit()  # 4 batches x 2 microbatches x (forward + loss)
    assert counter.calls == 1
    trainer.fit(duration="2ba", precision="amp_bf16")  # a new precision: built again
    assert counter.calls == 2
    trainer.close()


def test_default_transforms_are_no_transform_and_user_ones_run() -> None:
    spec = DataSpec(make_dataloader(2))
    assert spec.batch_transforms is no_transform and spec.device_transforms is no_transform
    assert spec.microbatch_transforms is no_transform
    batch_calls = _Counter(lambda batch: batch)
    micro_calls = _Counter(lambda batch: batch)
    trainer = _trainer(DataSpec(make_dataloader(3), batch_transforms=batch_calls,
                                microbatch_transforms=micro_calls), max_duration="3ba")
    trainer.fit()
    trainer.close()
    assert batch_calls.calls == 3 and micro_calls.calls == 3


class _Truncate(Algorithm):
    """Drops the last sample of every batch at AFTER_DATALOADER (as SelectiveBackprop
    prunes)."""

    def match(self, event: Event, state: Any) -> bool:
        return event == Event.AFTER_DATALOADER

    def apply(self, event: Event, state: Any, logger: Any) -> None:
        state.batch = [part[:-1] for part in state.batch]


@pytest.mark.parametrize("algorithms", [[], [_Truncate()]])
def test_counts_read_once_without_algorithms(monkeypatch: pytest.MonkeyPatch,
                                             algorithms: list[Algorithm]) -> None:
    shapes = _Counter(trainer_module.tensor_shapes)
    monkeypatch.setattr(trainer_module, "tensor_shapes", shapes)
    samples = _Counter(lambda batch: len(batch[0]))
    tokens = _Counter(lambda batch: 10 * len(batch[0]))
    spec = DataSpec(make_dataloader(3), get_num_samples_in_batch=samples,
                    get_num_tokens_in_batch=tokens)
    trainer = _trainer(spec, max_duration="3ba", algorithms=algorithms)
    trainer.fit()
    trainer.close()
    timestamp = trainer.state.timestamp
    # the timestamp counts the samples loaded (4 a batch), the tokens of the batch trained on
    assert int(timestamp.sample) == 12
    if algorithms:  # shapes before and after AFTER_DATALOADER; samples again on the pruned
        assert (shapes.calls, samples.calls, tokens.calls) == (6, 6, 6)
        assert int(timestamp.token) == 3 * 30
    else:
        assert (shapes.calls, samples.calls, tokens.calls) == (0, 3, 3)
        assert int(timestamp.token) == 3 * 40
