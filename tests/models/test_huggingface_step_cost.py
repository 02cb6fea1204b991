"""Per-step work of ``HuggingFaceModel`` + ``Trainer`` (issue 15, item 5): what a training step
must not do again every step. Behavioural counts, no timing (the timing is
``benchmarks/overhead.py --process-only``)."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

import cadence.dist
from cadence import Trainer
from cadence.models import HuggingFaceModel

VOCAB, SEQ, BATCH, STEPS = 64, 8, 4, 3


class TokenDataset(torch.utils.data.Dataset):
    """``STEPS * BATCH`` samples ``{"input_ids": [SEQ], "labels": [SEQ]}``."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, VOCAB, (STEPS * BATCH, SEQ), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def make_trainer() -> Trainer:
    """The whole-process benchmark's setting, small: the model built first, a DataLoader with
    ``cadence.dist.get_sampler``, ``HuggingFaceModel`` + ``Trainer`` with nothing optional."""
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(
        vocab_size=VOCAB, n_positions=SEQ, n_embd=16, n_layer=1, n_head=2, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None, use_cache=False))
    model.loss_type = "ForCausalLM"
    dataset = TokenDataset()
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=BATCH, sampler=cadence.dist.get_sampler(dataset, shuffle=False))
    return Trainer(model=HuggingFaceModel(model), train_dataloader=loader, max_duration="1ep",
                   optimizers=torch.optim.AdamW(model.parameters(), lr=1e-3),
                   progress_bar=False, device="cpu", seed=0)


def test_steps_do_not_inspect_the_forward_signature(monkeypatch):
    """The keys the wrapped forward takes are read once, at construction: a training step
    calls ``inspect.signature`` zero times (it costs ~20 us per call on GPT-2's forward)."""
    trainer = make_trainer()
    calls: list[Any] = []
    signature = inspect.signature

    def counting_signature(obj: Any, *args: Any, **kwargs: Any) -> inspect.Signature:
        calls.append(obj)
        return signature(obj, *args, **kwargs)

    monkeypatch.setattr(inspect, "signature", counting_signature)
    trainer.fit()
    assert int(trainer.state.timestamp.batch) == STEPS
    assert calls == []
    # the wrapper still filters by the names read at construction
    assert trainer.state.model._forward_keys is not None
    assert {"input_ids", "labels"} <= trainer.state.model._forward_keys
    trainer.close()


def test_train_mode_is_set_once_not_every_step(monkeypatch):
    """``model.train()`` walks every submodule; the loop calls it only when the model is not
    in training mode: one walk for a model left in eval mode, none for one in train mode."""
    trainer = make_trainer()
    model = trainer.state.model
    n_modules = len(list(model.modules()))
    walked: list[nn.Module] = []
    train = nn.Module.train

    def counting_train(self: nn.Module, mode: bool = True) -> nn.Module:
        walked.append(self)
        return train(self, mode)

    monkeypatch.setattr(nn.Module, "train", counting_train)
    model.eval()  # a walk of its own, not counted below
    walked.clear()
    trainer.fit()
    assert int(trainer.state.timestamp.batch) == STEPS
    assert len(walked) == n_modules  # one walk over STEPS steps
    assert model.training

    trainer.state.max_duration = cadence.Time(2, cadence.TimeUnit.EPOCH)
    walked.clear()
    trainer.fit()
    assert int(trainer.state.timestamp.batch) == 2 * STEPS
    assert walked == []  # already in train mode: no walk at all
    trainer.close()
