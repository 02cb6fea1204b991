"""``accumulate_train_batch_on_tokens``: any split of a batch of padded sequences into
microbatches and data-parallel ranks gives the whole batch's step (the gradient of its
mean loss per token); off, microbatches are weighted by samples, as before."""

from __future__ import annotations

import copy
import logging
from typing import Any, Optional

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from cadence import Callback, State, Trainer, dist
from cadence.loggers import InMemoryLogger
from cadence.models.huggingface import HuggingFaceModel
from tests.common.models import SimpleModel, make_dataloader

LENGTHS = (3, 16, 5, 12)  # tokens per sequence, padded to 16
SEQ, VOCAB, LR = 16, 64, 1.0
REL = 1e-6  # the bound: parameters equal to 1e-6, relative


class PaddedSequences(Dataset):
    """Four sequences of very different lengths, right-padded (labels -100 on padding)."""

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(3)
        self.items = []
        for length in LENGTHS:
            ids = torch.zeros(SEQ, dtype=torch.long)
            ids[:length] = torch.randint(1, VOCAB, (length,), generator=gen)
            mask = (torch.arange(SEQ) < length).long()
            self.items.append({"input_ids": ids, "attention_mask": mask,
                               "labels": ids.masked_fill(mask == 0, -100)})

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.items[index]


def tiny_lm(num_items: bool = True) -> HuggingFaceModel:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=16, vocab_size=VOCAB, n_positions=SEQ,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None,
                        eos_token_id=None, loss_type="ForCausalLM")
    model = HuggingFaceModel(GPT2LMHeadModel(config))
    if not num_items:  # the weighting path for a loss that is a plain mean over tokens
        model._accepts_num_items = False
    return model


def full_batch() -> dict[str, torch.Tensor]:
    data = PaddedSequences()
    return {k: torch.stack([item[k] for item in data.items]) for k in data.items[0]}


def reference_step(per_token: bool) -> tuple[dict[str, torch.Tensor], float]:
    """The step by hand: SGD on the batch's mean loss per token (or, ``per_token=False``,
    the mean over sequences of each sequence's mean per token); and that loss."""
    model = tiny_lm()
    batch = full_batch()
    if per_token:
        loss = model(batch).loss
    else:
        loss = torch.stack([model({k: v[i:i + 1] for k, v in batch.items()}).loss
                            for i in range(len(LENGTHS))]).mean()
    loss.backward()
    with torch.no_grad():
        return {n: p - LR * p.grad for n, p in model.named_parameters()}, float(loss)


def train_one_step(on_tokens: bool, microbatch: Optional[int], num_items: bool = True,
                   parallelism_config: Optional[dict[str, Any]] = None,
                   ) -> tuple[dict[str, torch.Tensor], float]:
    """Parameters after one step of the Trainer (full tensors), and the logged loss."""
    model = tiny_lm(num_items)
    data = PaddedSequences()
    ranks = dist.get_world_size()
    sampler = dist.get_sampler(data, shuffle=False) if ranks > 1 else None
    loader = DataLoader(data, batch_size=len(data) // ranks, sampler=sampler)
    memory = InMemoryLogger()
    trainer = Trainer(model=model, train_dataloader=loader, max_duration="1ba",
                      optimizers=torch.optim.SGD(model.parameters(), lr=LR),
                      device_train_microbatch_size=microbatch,
                      accumulate_train_batch_on_tokens=on_tokens, loggers=[memory],
                      parallelism_config=parallelism_config, progress_bar=False, seed=0,
                      device="cpu")
    trainer.fit()
    params = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
              for n, p in trainer.state.model.named_parameters()}
    params = {n.replace("module.", "", 1) if n.startswith("module.") else n: p
              for n, p in params.items()}
    loss = float(memory.data["loss/train/total"][-1][1])
    trainer.close()
    return params, loss


def assert_same_params(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name in want:
        diff = float((got[name] - want[name]).norm() / want[name].norm())
        assert diff <= REL, f"{name}: relative difference {diff:.2e}"


def worst_difference(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    return max(float((got[n] - want[n]).norm() / want[n].norm()) for n in want)


@pytest.mark.parametrize("num_items", [True, False], ids=["num_items_in_batch", "weights"])
@pytest.mark.parametrize("microbatch", [None, 1, 2])
def test_any_microbatch_split_gives_the_whole_batch_step(microbatch: Optional[int],
                                                         num_items: bool) -> None:
    want, want_loss = reference_step(per_token=True)
    got, loss = train_one_step(True, microbatch, num_items)
    assert_same_params(got, want)
    assert loss == pytest.approx(want_loss, rel=1e-6)  # the batch's mean loss per token


def test_off_weights_microbatches_by_samples() -> None:
    whole, _ = reference_step(per_token=True)
    by_samples, samples_loss = reference_step(per_token=False)
    got, loss = train_one_step(False, 1)
    assert_same_params(got, by_samples)  # the old behaviour: sample-weighted
    assert loss == pytest.approx(samples_loss, rel=1e-6)
    assert worst_difference(got, whole) > 1e-3  # ... which is not the whole batch's step
    got_whole, _ = train_one_step(False, None)  # one microbatch: the whole batch, as before
    assert_same_params(got_whole, whole)


@pytest.mark.world_size(2)
@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_two_ranks_two_microbatches_give_the_whole_batch_step(parallelism: str) -> None:
    # rank 0 holds sequences of 3 and 5 tokens, rank 1 of 16 and 12
    want, want_loss = reference_step(per_token=True)
    counts: list[torch.dtype] = []
    real = torch.distributed.all_reduce

    def counting(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        counts.append(tensor.dtype)
        return real(tensor, *args, **kwargs)

    torch.distributed.all_reduce = counting
    try:
        got, loss = train_one_step(True, 1, parallelism_config={"fsdp": {}}
                                   if parallelism == "fsdp" else None)
    finally:
        torch.distributed.all_reduce = real
    assert_same_params(got, want)
    assert loss == pytest.approx(want_loss, rel=1e-6)
    assert counts.count(torch.int64) == 1  # one all-reduce of the count per batch


class GradCapture(Callback):
    def __init__(self) -> None:
        self.grads: dict[str, torch.Tensor] = {}

    def after_train_batch(self, state: State, logger: Any) -> None:
        self.grads = {n: p.grad.clone() for n, p in state.model.named_parameters()}


def test_a_model_without_a_token_count_falls_back_to_samples(
        caplog: pytest.LogCaptureFixture) -> None:
    grads = []
    for on_tokens in (False, True):
        torch.manual_seed(0)
        model, capture = SimpleModel(), GradCapture()
        with caplog.at_level(logging.WARNING, logger="cadence.trainer.loss_weighting"):
            Trainer(model=model, train_dataloader=make_dataloader(num_batches=1, batch_size=6),
                    max_duration="1ba", device_train_microbatch_size=4, callbacks=[capture],
                    accumulate_train_batch_on_tokens=on_tokens, progress_bar=False,
                    seed=0).fit()
        grads.append(capture.grads)
    assert "has no num_loss_tokens" in caplog.text and "weighted by samples" in caplog.text
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=0, atol=0)


def test_num_loss_tokens_and_num_items_in_batch() -> None:
    model = tiny_lm()
    batch = full_batch()
    # shifted labels: each sequence of n tokens predicts n - 1 of them
    assert int(model.num_loss_tokens(batch)) == sum(n - 1 for n in LENGTHS)
    assert model.accepts_num_items_in_batch
    mean = model(batch).loss
    total = model({**batch, "num_items_in_batch": torch.tensor(100)}).loss
    torch.testing.assert_close(total, mean * sum(n - 1 for n in LENGTHS) / 100)
    no_labels = {k: v for k, v in batch.items() if k != "labels"}
    assert int(model.num_loss_tokens(no_labels)) == 0
    copy.deepcopy(model)  # the wrapper stays copyable


class _Masked(Dataset):
    """:class:`PaddedSequences` repeated; the samples in ``masked`` have every label -100."""

    def __init__(self, copies: int, masked: set[int]) -> None:
        base = PaddedSequences().items
        self.items = []
        for index in range(copies * len(base)):
            item = dict(base[index % len(base)])
            if index in masked:
                item["labels"] = torch.full_like(item["labels"], -100)
            self.items.append(item)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.items[index]


class _ParamsAt(Callback):
    def __init__(self) -> None:
        self.params: dict[int, torch.Tensor] = {}

    def batch_end(self, state: State, logger: Any) -> None:
        flat = torch.cat([p.detach().reshape(-1) for p in state.model.parameters()])
        self.params[int(state.timestamp.batch)] = flat.clone()


def test_a_batch_without_loss_tokens_is_not_a_step(caplog: pytest.LogCaptureFixture) -> None:
    """With ``accumulate_train_batch_on_tokens``, a batch whose labels are all -100 moves no
    weight (no AdamW step, no weight decay), logs no loss, and is counted in a warning."""
    data = _Masked(copies=3, masked={4, 5, 6, 7})  # batch 2 of 3 has no loss token
    model = tiny_lm()
    memory, params = InMemoryLogger(), _ParamsAt()
    trainer = Trainer(model=model, train_dataloader=DataLoader(data, batch_size=4),
                      max_duration="3ba", accumulate_train_batch_on_tokens=True,
                      optimizers=torch.optim.AdamW(model.parameters(), lr=1e-2,
                                                   weight_decay=0.1),
                      loggers=[memory], callbacks=[params], log_interval="1ba",
                      progress_bar=False, seed=0, device="cpu")
    with caplog.at_level(logging.WARNING, logger="cadence.trainer.trainer"):
        trainer.fit()
    trainer.close()
    assert torch.equal(params.params[2], params.params[1])
    assert not torch.equal(params.params[3], params.params[2])
    steps, values = memory.steps_and_values("loss/train/total")
    assert steps == [1, 3] and all(v == v and v > 0 for v in values)
    assert any("no loss token" in r.getMessage() and "1 batch" in r.getMessage()
               for r in caplog.records)


def test_a_run_whose_first_batches_have_no_loss_tokens_is_refused() -> None:
    data = _Masked(copies=12, masked=set(range(48)))
    trainer = Trainer(model=tiny_lm(), train_dataloader=DataLoader(data, batch_size=4),
                      max_duration="12ba", accumulate_train_batch_on_tokens=True,
                      progress_bar=False, seed=0, device="cpu")
    with pytest.raises(ValueError, match=r"first 10 batches.*no loss token.*-100"):
        trainer.fit()
    trainer.close()


def test_by_samples_a_microbatch_without_loss_tokens_gives_no_nan() -> None:
    data = _Masked(copies=1, masked={0, 1})  # the batch's first microbatch of 2 is all -100
    memory = InMemoryLogger()
    trainer = Trainer(model=tiny_lm(), train_dataloader=DataLoader(data, batch_size=4),
                      max_duration="1ba", device_train_microbatch_size=2, loggers=[memory],
                      progress_bar=False, seed=0, device="cpu")
    trainer.fit()
    trainer.close()
    (value,) = memory.steps_and_values("loss/train/total")[1]
    assert value == value and value > 0  # not nan
