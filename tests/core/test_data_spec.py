"""DataSpec (Composer's): accepted wherever a dataloader is, its transforms, splitting and
counters used by the Trainer, and Composer's defaults."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from cadence import Callback, DataSpec, Evaluator, Trainer
from cadence.core import ensure_data_spec
from cadence.core.data_spec import default_split_batch
from tests.common.models import SimpleModel, make_dataloader


class Seen(Callback):
    """What the model was given: each microbatch's first tensor, per event."""

    def __init__(self) -> None:
        self.forward: list[torch.Tensor] = []
        self.eval_forward: list[torch.Tensor] = []
        self.eval_samples: list[int] = []

    def before_forward(self, state: Any, logger: Any) -> None:
        self.forward.append(state.batch[0].clone())

    def eval_before_forward(self, state: Any, logger: Any) -> None:
        self.eval_forward.append(state.batch[0].clone())

    def eval_end(self, state: Any, logger: Any) -> None:
        self.eval_samples.append(int(state.eval_timestamp.sample))


def shift(batch: Any) -> Any:
    """A device transform: x + 100 (the model sees only shifted inputs)."""
    x, y = batch
    return x + 100.0, y


def test_trainer_uses_the_train_specs_transform_split_and_counters() -> None:
    loader = make_dataloader(num_batches=3, batch_size=4)
    splits: list[int] = []

    def split(batch: Any, size: int) -> list[Any]:
        splits.append(size)
        x, y = batch
        return [(x[i:i + size], y[i:i + size]) for i in range(0, len(x), size)]

    spec = DataSpec(loader, device_transforms=shift, split_batch=split,
                    get_num_samples_in_batch=lambda b: 10 * len(b[0]),
                    get_num_tokens_in_batch=lambda b: 7 * len(b[0]))
    seen = Seen()
    trainer = Trainer(model=SimpleModel(), train_dataloader=spec, max_duration="1ep", seed=0,
                      progress_bar=False, device_train_microbatch_size=2, callbacks=[seen])
    assert trainer.state.train_dataloader is loader  # the state holds the dataloader itself
    assert int(trainer.state.dataloader_len) == 3
    trainer.fit()
    ts = trainer.state.timestamp
    assert (int(ts.batch), int(ts.sample), int(ts.token)) == (3, 3 * 40, 3 * 28)
    assert splits == [2, 2, 2]  # the spec's split, once per batch
    assert len(seen.forward) == 6 and all(x.shape[0] == 2 for x in seen.forward)
    raw = torch.cat([x for x, _ in loader])
    assert torch.equal(torch.cat(seen.forward), raw + 100.0)  # transformed on the device
    trainer.close()


def test_default_counters_count_input_ids_tokens() -> None:
    spec = DataSpec([{"input_ids": torch.zeros(4, 9, dtype=torch.long)}])
    batch = {"input_ids": torch.zeros(4, 9, dtype=torch.long), "labels": torch.zeros(4, 9)}
    assert spec.get_num_samples_in_batch(batch) == 4
    assert spec.get_num_tokens_in_batch(batch) == 36

    class Seq(Dataset):
        max_seq_len = 5

        def __len__(self) -> int:
            return 6

        def __getitem__(self, i: int) -> torch.Tensor:
            return torch.zeros(5)

    seq = DataSpec(DataLoader(Seq(), batch_size=3))
    assert seq.num_samples == 6  # len(dataset), Composer's default
    assert seq.get_num_tokens_in_batch(torch.zeros(3, 5)) == 15  # max_seq_len * samples
    assert DataSpec([torch.zeros(2, 3)]).get_num_tokens_in_batch(torch.zeros(2, 3)) == 0


def test_default_sample_count_refuses_disagreeing_tensors() -> None:
    spec = DataSpec([])
    assert spec.get_num_samples_in_batch((torch.zeros(3, 2), torch.zeros(3))) == 3
    assert spec.get_num_samples_in_batch({"x": torch.zeros(5, 2), "names": ["a"] * 5}) == 5
    with pytest.raises(NotImplementedError, match=r"different leading sizes \[3, 4\]"):
        spec.get_num_samples_in_batch((torch.zeros(3, 2), torch.zeros(4)))
    with pytest.raises(ValueError, match="get_num_samples_in_batch"):
        spec.get_num_samples_in_batch("text")


def test_default_split_batch() -> None:
    x, y = torch.arange(10).view(5, 2), torch.arange(5)
    parts = default_split_batch((x, y), 2)
    assert [len(p[1]) for p in parts] == [2, 2, 1] and torch.equal(parts[2][0], x[4:])
    parts = default_split_batch({"x": x, "task": "cls"}, 3)
    assert [p["x"].shape[0] for p in parts] == [3, 2] and all(p["task"] == "cls" for p in parts)
    assert default_split_batch(["a", "b", "c"], 2) == [["a", "b"], ["c"]]  # primitives
    with pytest.raises(ValueError, match="int microbatch_size"):
        default_split_batch(x, 2.0)


def test_ensure_data_spec() -> None:
    loader = make_dataloader()
    spec = DataSpec(loader)
    assert ensure_data_spec(spec) is spec
    assert ensure_data_spec(loader).dataloader is loader
    made = ensure_data_spec({"dataloader": loader, "num_tokens": 12})
    assert made.dataloader is loader and made.num_tokens == 12
    with pytest.raises(TypeError, match="got a DataSpec"):
        DataSpec(spec)


def test_evaluator_fit_eval_and_predict_take_a_data_spec() -> None:
    eval_loader = make_dataloader(num_batches=2, seed=1)
    evaluator = Evaluator(label="val", dataloader=DataSpec(
        eval_loader, device_transforms=shift, get_num_samples_in_batch=lambda b: 1))
    assert isinstance(evaluator.dataloader, DataSpec)
    assert evaluator.dataloader.dataloader is eval_loader  # Composer's attribute path
    seen = Seen()
    trainer = Trainer(model=SimpleModel(), max_duration="2ba", seed=0, progress_bar=False,
                      eval_dataloader=evaluator, callbacks=[seen])
    raw_eval = torch.cat([x for x, _ in eval_loader])
    trainer.eval()  # the Trainer's own evaluator: its counter says 1 sample per batch
    assert seen.eval_samples == [2] and torch.equal(torch.cat(seen.eval_forward), raw_eval + 100.0)
    seen.eval_forward.clear()
    train = make_dataloader(num_batches=2)
    trainer.fit(train_dataloader=DataSpec(train, get_num_tokens_in_batch=lambda b: 3),
                eval_dataloader=DataSpec(eval_loader, device_transforms=shift),
                eval_interval="1ep")
    assert trainer.state.train_dataloader is train and int(trainer.state.timestamp.token) == 6
    assert torch.equal(torch.cat(seen.eval_forward), raw_eval + 100.0)  # fit's, once
    trainer.eval(eval_dataloader=DataSpec(eval_loader))  # untransformed, counted by default
    assert seen.eval_samples[-1] == 8

    zeroed = DataSpec(eval_loader, device_transforms=lambda b: (torch.zeros_like(b[0]), b[1]))
    outputs = torch.cat(trainer.predict(zeroed))
    assert outputs.shape == (8, 3) and torch.allclose(outputs, outputs[:1].expand(8, 3))
    trainer.close()


def test_a_resumed_run_continues_the_specs_dataloader_mid_epoch(tmp_path: Any) -> None:
    loader = make_dataloader(num_batches=4, batch_size=4)
    raw = [x for x, _ in loader]

    def run(max_duration: str) -> Seen:
        seen = Seen()
        trainer = Trainer(model=SimpleModel(), train_dataloader=DataSpec(loader),
                          max_duration=max_duration, seed=0, progress_bar=False,
                          run_name="spec", save_folder=str(tmp_path), save_interval="1ba",
                          autoresume=True, callbacks=[seen])
        trainer.fit()
        trainer.close()
        return seen

    assert [torch.equal(a, b) for a, b in zip(run("2ba").forward, raw)] == [True, True]
    resumed = run("4ba").forward  # the epoch's remaining batches only
    assert len(resumed) == 2 and torch.equal(resumed[0], raw[2]) and torch.equal(resumed[1], raw[3])


def test_batch_transforms_run_before_counting_and_microbatch_transforms_per_microbatch() -> None:
    """Composer 0.32's order: ``batch_transforms`` on the whole host batch (its result is
    what is counted), then per microbatch on the device ``microbatch_transforms``; eval and
    predict run both on each batch."""
    loader = make_dataloader(num_batches=2, batch_size=4)
    batch_sizes: list[int] = []
    micro_sizes: list[int] = []

    def double(batch: Any) -> Any:  # the batch doubled: counted as 8 samples
        x, y = batch
        batch_sizes.append(len(x))
        return torch.cat([x, x]), torch.cat([y, y])

    def plus_one(batch: Any) -> Any:
        x, y = batch
        micro_sizes.append(len(x))
        return x + 1.0, y

    seen = Seen()
    spec = DataSpec(loader, batch_transforms=double, microbatch_transforms=plus_one)
    trainer = Trainer(model=SimpleModel(), train_dataloader=spec, max_duration="1ep", seed=0,
                      progress_bar=False, device_train_microbatch_size=4, callbacks=[seen],
                      eval_dataloader=DataSpec(make_dataloader(num_batches=1, batch_size=4),
                                               batch_transforms=double,
                                               microbatch_transforms=plus_one),
                      eval_interval="1ep")
    trainer.fit()
    assert int(trainer.state.timestamp.sample) == 2 * 8  # counted after batch_transforms
    assert batch_sizes[:2] == [4, 4] and micro_sizes[:4] == [4, 4, 4, 4]  # 2 microbatches each
    raw = torch.cat([x for x, _ in loader])
    assert torch.equal(torch.cat(seen.forward), torch.cat([raw[:4], raw[:4], raw[4:], raw[4:]])
                       + 1.0)
    assert len(seen.eval_forward) == 1 and seen.eval_forward[0].shape[0] == 8
    predicted = trainer.predict(DataSpec(make_dataloader(num_batches=1, batch_size=4),
                                         batch_transforms=double, microbatch_transforms=plus_one))
    assert predicted[0].shape[0] == 8
    trainer.close()


def test_eval_microbatches_give_the_same_metrics_with_smaller_forwards() -> None:
    sizes: list[int] = []

    class Sizes(Callback):
        def eval_before_forward(self, state: Any, logger: Any) -> None:
            sizes.append(int(state.batch[0].shape[0]))

    results = []
    for size in (None, 3):
        evaluator = Evaluator(label="eval", dataloader=make_dataloader(num_batches=2, batch_size=8),
                              device_eval_microbatch_size=size)
        torch.manual_seed(0)  # the same weights both times
        trainer = Trainer(model=SimpleModel(), max_duration="1ba", seed=0, progress_bar=False,
                          callbacks=[Sizes()])
        results.append(trainer.eval(evaluator))
        trainer.close()
    assert sizes == [8, 8, 3, 3, 2, 3, 3, 2]  # two batches of 8: whole, then 3 + 3 + 2
    assert results[0] == pytest.approx(results[1])
    with pytest.raises(ValueError, match="device_eval_microbatch_size"):
        Evaluator(label="eval", dataloader=make_dataloader(), device_eval_microbatch_size="auto")


def test_ensure_evaluator_wraps_loaders_and_keeps_evaluators() -> None:
    from cadence.core import ensure_evaluator

    loader = make_dataloader()
    made = ensure_evaluator(loader, default_metric_names=["Accuracy"])
    assert made.label == "eval" and made.metric_names == ["Accuracy"]
    assert made.dataloader.dataloader is loader
    given = Evaluator(label="val", dataloader=loader)
    assert ensure_evaluator(given, default_metric_names=[]) is given
    from_dict = ensure_evaluator({"label": "held_out", "dataloader": loader}, ["Accuracy"])
    assert from_dict.label == "held_out" and from_dict.metric_names == ["Accuracy"]


def test_token_counter_returning_a_dict_by_token_type() -> None:
    """B3 (issue 33): llm-foundry's counter returns ``{'total': n, 'loss_generating': m}``;
    the timestamp counts ``total``, and ``token_type=`` picks either (Composer's API)."""
    loader = make_dataloader(num_batches=2, batch_size=4)
    spec = DataSpec(loader, get_num_tokens_in_batch=lambda b: {
        "total": 5 * len(b[0]), "loss_generating": 3 * len(b[0])})
    batch = next(iter(loader))
    assert spec.get_num_tokens_in_batch(batch) == 20
    assert spec.get_num_tokens_in_batch(batch, token_type="loss_generating") == 12
    with pytest.raises(ValueError, match="'padding'.*loss_generating"):
        spec.get_num_tokens_in_batch(batch, token_type="padding")
    trainer = Trainer(model=SimpleModel(), train_dataloader=spec, max_duration="2ba",
                      progress_bar=False)
    trainer.fit()
    assert int(trainer.state.timestamp.token) == 2 * 20
    bad = DataSpec(loader, get_num_tokens_in_batch=lambda b: "many")
    with pytest.raises(ValueError, match="str"):
        bad.get_num_tokens_in_batch(batch)


def test_split_of_a_mapping_holding_a_list_of_0_dim_tensors() -> None:
    """B4 (issue 33): a list value in a mapping is a list of samples, sliced as a list
    (llm-foundry's in-context-learning batches hold lists of 0-dim tensors)."""
    from cadence.core.data_spec import _default_split_batch, _split_list

    batch = {"input_ids": torch.arange(8).reshape(4, 2),
             "gold": [torch.tensor(i) for i in range(4)], "mode": "icl"}
    chunks = _default_split_batch(batch, 2)
    assert len(chunks) == 2
    assert [int(t) for t in chunks[1]["gold"]] == [2, 3]
    assert torch.equal(chunks[1]["input_ids"], torch.tensor([[4, 5], [6, 7]]))
    assert chunks[0]["mode"] == "icl"
    assert _split_list([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
    assert _split_list([1], 4) == [[1]]
