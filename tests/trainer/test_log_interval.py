"""``log_interval`` honours its unit (issue 30, item 6): the batches at which
``loss/train/total`` reaches a logger, for ``ba``, ``ep``, ``dur``, ``sp`` and ``tok``, with the
first batch and the end of training logged too; a console destination's own interval
(``console_log_interval``) is honoured as well."""

from __future__ import annotations

import io
from typing import Any, Iterator

import pytest
import torch

from cadence import DataSpec, Trainer
from cadence.loggers import InMemoryLogger
from tests.common.models import SimpleModel, make_dataloader


def _logged_batches(memory: InMemoryLogger, key: str = "loss/train/total") -> list[int]:
    return [int(timestamp.batch) for timestamp, _ in memory.data.get(key, [])]


def _fit(log_interval: Any, max_duration: str, num_batches: int,
         train_dataloader: Any = None, **kwargs: Any) -> tuple[Trainer, InMemoryLogger]:
    memory = InMemoryLogger()
    torch.manual_seed(0)  # the same initial weights in every run
    model = SimpleModel()
    trainer = Trainer(model=model, max_duration=max_duration, log_interval=log_interval,
                      train_dataloader=(train_dataloader if train_dataloader is not None
                                        else make_dataloader(num_batches)),
                      optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
                      loggers=[memory], progress_bar=False, device="cpu", seed=0, **kwargs)
    trainer.fit()
    trainer.close()
    return trainer, memory


@pytest.mark.parametrize("log_interval,max_duration,num_batches,expected", [
    # the case: 2 epochs of 6 batches logged the loss 12 times
    ("1ep", "2ep", 6, [1, 6, 12]),
    ("2ep", "3ep", 3, [1, 6, 9]),  # epoch 2's end, then the end of training
    ("10ba", "2ep", 3, [1, 6]),  # the end of a run in epochs is its last epoch's end
    ("1ep", "5ba", 3, [1, 3, 5]),  # an epoch's end, then the end of training mid-epoch
    (2, "3ba", 3, [1, 2, 3]),  # an int is batches
    ("2ba", "5ba", 5, [1, 2, 4, 5]),
    ("0.25dur", "8ba", 8, [1, 2, 4, 6, 8]),
    ("0.5dur", "2ep", 3, [1, 3, 6]),  # max_duration in epochs: a fraction of its 6 batches
    ("10sp", "6ba", 6, [1, 3, 5, 6]),  # 4 samples a batch: 12 crosses 10, 20 crosses 20
])
def test_log_interval_in_each_unit(log_interval: Any, max_duration: str, num_batches: int,
                                   expected: list[int]) -> None:
    _, memory = _fit(log_interval, max_duration, num_batches)
    assert _logged_batches(memory) == expected
    # the train metrics go with the loss
    assert _logged_batches(memory, "metrics/train/MulticlassAccuracy") == expected


def test_log_interval_in_tokens_counts_the_data_specs_tokens() -> None:
    # 4 samples x 5 tokens = 20 tokens a batch: 60 crosses 50, 100 crosses 100, 160 crosses 150
    spec = DataSpec(make_dataloader(8), get_num_tokens_in_batch=lambda batch: 5 * len(batch[0]))
    trainer, memory = _fit("50tok", "8ba", 8, train_dataloader=spec)
    assert int(trainer.state.timestamp.token) == 160
    assert _logged_batches(memory) == [1, 3, 5, 8]


def test_each_logged_loss_is_that_batchs() -> None:
    """At an epoch's end the loss logged is the epoch's last batch's (per-batch losses from a
    run that logs every batch)."""
    _, every = _fit("1ba", "2ep", 3)
    _, epochs = _fit("1ep", "2ep", 3)
    losses = dict(zip(_logged_batches(every), (v for _, v in every.data["loss/train/total"])))
    assert [v for _, v in epochs.data["loss/train/total"]] == [losses[1], losses[3], losses[6]]


class _Unsized:
    """An iterable without ``len``: the epoch's end is known only when it runs out."""

    def __init__(self, num_batches: int) -> None:
        self.loader = make_dataloader(num_batches)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.loader)


def test_epochs_with_an_unsized_dataloader() -> None:
    _, memory = _fit("1ep", "2ep", 3, train_dataloader=_Unsized(3))
    assert _logged_batches(memory) == [1, 3, 6]


def test_a_fraction_of_epochs_needs_a_sized_dataloader() -> None:
    with pytest.raises(ValueError, match="log_interval=0.5dur .*sized"):
        _fit("0.5dur", "2ep", 3, train_dataloader=_Unsized(3))


def test_console_log_interval_prints_every_batch_with_the_default_log_interval() -> None:
    """An llm-foundry run file's ``console_log_interval: 1ba`` (no ``log_interval``) printed
    the loss at the first and last batch only: the loss is logged at the console's interval."""
    stream = io.StringIO()
    _, memory = _fit("10ba", "8ba", 8, log_to_console=True, console_stream=stream,
                     console_log_interval="1ba")
    lines = stream.getvalue().splitlines()
    assert sum(line.startswith("\t Train loss/train/total: ") for line in lines) == 8
    assert _logged_batches(memory) == list(range(1, 9))
