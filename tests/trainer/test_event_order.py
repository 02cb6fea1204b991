"""The Trainer fires events exactly in the order DESIGN.md lists."""

from __future__ import annotations

from cadence import Event, Trainer
from tests.common.events import EventCounter, StopAt
from tests.common.models import SimpleModel, make_dataloader

E = Event


def expected_events(epochs: int, batches: int, microbatches: int, eval_batches: int) -> list[Event]:
    evaluation = [E.EVAL_BEFORE_ALL, E.EVAL_START]
    evaluation += [E.EVAL_BATCH_START, E.EVAL_BEFORE_FORWARD, E.EVAL_AFTER_FORWARD,
                   E.EVAL_BATCH_END] * eval_batches
    evaluation += [E.EVAL_END, E.EVAL_AFTER_ALL]
    microbatch = [E.BEFORE_FORWARD, E.AFTER_FORWARD, E.BEFORE_LOSS, E.AFTER_LOSS,
                  E.BEFORE_BACKWARD, E.AFTER_BACKWARD]
    batch = [E.BEFORE_DATALOADER, E.AFTER_DATALOADER, E.BATCH_START, E.BEFORE_TRAIN_BATCH,
             *microbatch * microbatches, E.AFTER_TRAIN_BATCH, E.BATCH_END, E.BATCH_CHECKPOINT]
    epoch = [E.EPOCH_START, *batch * batches, E.EPOCH_END, *evaluation, E.EPOCH_CHECKPOINT]
    return [E.INIT, E.BEFORE_LOAD, E.AFTER_LOAD, E.FIT_START, *epoch * epochs, E.FIT_END]


def test_event_order_2ep_3ba_2mb_eval_every_epoch() -> None:
    counter = EventCounter()
    trainer = Trainer(
        model=SimpleModel(),
        train_dataloader=make_dataloader(num_batches=3, batch_size=4),
        eval_dataloader=make_dataloader(num_batches=2, batch_size=4, seed=1),
        max_duration="2ep",
        eval_interval="1ep",
        device_train_microbatch_size=2,
        callbacks=[counter],
        progress_bar=False,
        seed=0,
    )
    trainer.fit()
    trainer.close()
    expected = expected_events(epochs=2, batches=3, microbatches=2, eval_batches=2)
    assert counter.events == expected
    assert counter.counts[E.BEFORE_FORWARD] == 12
    assert counter.counts[E.EVAL_START] == 2
    assert trainer.state.timestamp.epoch == 2 and trainer.state.timestamp.batch == 6
    assert trainer.state.timestamp.sample == 24


def test_every_event_fires_in_a_run_with_eval_then_eval_and_predict() -> None:
    counter = EventCounter()
    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(),
                      eval_dataloader=make_dataloader(seed=1), max_duration="1ep",
                      callbacks=[counter], progress_bar=False, seed=0)
    trainer.fit()
    assert not any(e.is_predict or "standalone" in e.value for e in counter.counts)
    trainer.eval()
    trainer.predict(make_dataloader(num_batches=1, seed=2))
    assert set(counter.counts) == set(Event)


def test_batch_duration_ends_mid_epoch_and_evaluates_at_the_end() -> None:
    counter = EventCounter()
    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=3),
                      eval_dataloader=make_dataloader(num_batches=1, seed=1), max_duration="4ba",
                      eval_interval="2ba", callbacks=[counter], progress_bar=False, seed=0)
    trainer.fit()
    assert trainer.state.timestamp.batch == 4 and trainer.state.timestamp.epoch == 1
    assert counter.counts[E.EPOCH_END] == 1  # the second epoch was cut short
    assert counter.counts[E.EVAL_START] == 2  # after batch 2 and batch 4 (the end)
    assert counter.counts[E.BATCH_END] == 4


def test_stop_training_ends_after_the_current_batch() -> None:
    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=5),
                      max_duration="3ep", callbacks=[StopAt(2)], progress_bar=False, seed=0)
    trainer.fit()
    assert trainer.state.timestamp.batch == 2
