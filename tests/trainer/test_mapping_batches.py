"""A tokenizer's ``BatchEncoding`` (a Mapping, not a dict) trains like a dict batch: it is
counted (samples, tokens), sliced into microbatches (still BatchEncodings) and moved to the
device, and microbatching gives the same update as the whole batch."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from cadence import ComposerModel, Trainer
from cadence.core.data_spec import batch_to_device, num_samples, slice_batch, split_batch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "far", "away"]
SENTENCES = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(2 + i % 5)) for i in range(16)]
SEQ = 8


def make_tokenizer() -> Any:
    """A real ``PreTrainedTokenizerFast`` (word level, in memory: no hub)."""
    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    model = tokenizers.models.WordLevel(vocab=vocab, unk_token="[UNK]")
    core = tokenizers.Tokenizer(model)
    core.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]",
                                                unk_token="[UNK]")


class BagOfWords(ComposerModel):
    """``input_ids [batch, seq]`` -> mean embedding -> 2 logits; records the batches it sees."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, 8)
        self.head = torch.nn.Linear(8, 2)
        self.seen: list[tuple[str, int]] = []

    def forward(self, batch: Any) -> torch.Tensor:
        self.seen.append((type(batch).__name__, int(batch["input_ids"].shape[0])))
        mask = batch["attention_mask"].unsqueeze(-1).float()
        pooled = (self.embed(batch["input_ids"]) * mask).sum(1) / mask.sum(1).clamp(min=1)
        return self.head(pooled)

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return F.cross_entropy(outputs, batch["labels"])


def make_loader(tokenizer: Any, batch_size: int = 4) -> DataLoader:
    def collate(indices: list[int]) -> Any:
        encoding = tokenizer([SENTENCES[i] for i in indices], padding="max_length",
                             max_length=SEQ, truncation=True, return_tensors="pt")
        encoding["labels"] = torch.tensor([i % 2 for i in indices])
        return encoding

    return DataLoader(list(range(len(SENTENCES))), batch_size=batch_size, collate_fn=collate)


def test_batch_helpers_keep_a_batch_encoding() -> None:
    batch = next(iter(make_loader(make_tokenizer())))
    assert isinstance(batch, transformers.BatchEncoding) and not isinstance(batch, dict)
    assert num_samples(batch) == 4
    halves = split_batch(batch, 3)
    assert [type(h).__name__ for h in halves] == ["BatchEncoding"] * 2
    assert [num_samples(h) for h in halves] == [3, 1]
    assert torch.equal(halves[1]["input_ids"], batch["input_ids"][3:])
    assert torch.equal(slice_batch(batch, 1, 2)["labels"], batch["labels"][1:2])
    moved = batch_to_device(batch, torch.device("cpu"))
    assert isinstance(moved, transformers.BatchEncoding) and moved.input_ids is moved["input_ids"]


def _train(microbatch: Any) -> tuple[Trainer, BagOfWords]:
    tokenizer = make_tokenizer()
    torch.manual_seed(0)
    model = BagOfWords(len(tokenizer))
    trainer = Trainer(model=model, train_dataloader=make_loader(tokenizer), max_duration="2ba",
                      optimizers=torch.optim.SGD(model.parameters(), lr=0.5),
                      device_train_microbatch_size=microbatch, progress_bar=False, seed=1,
                      device="cpu")
    trainer.fit()
    trainer.close()
    return trainer, model


def test_fit_counts_splits_and_trains_on_batch_encodings() -> None:
    whole, whole_model = _train(None)
    micro, micro_model = _train(2)
    timestamp = micro.state.timestamp
    assert timestamp.batch == 2 and timestamp.sample == 8
    assert timestamp.token == 8 * SEQ  # counted from input_ids of the BatchEncoding
    assert micro_model.seen == [("BatchEncoding", 2)] * 4  # 2 batches x 2 microbatches
    assert whole_model.seen == [("BatchEncoding", 4)] * 2
    for a, b in zip(whole_model.parameters(), micro_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # same update, split or not
