"""A language-model dataloader of random tokens, for tests that need ``input_ids`` batches
without a corpus or a tokenizer (``train_loader: {name: tests.common.lm_data.random_tokens}``)."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset


class _RandomTokens(Dataset):
    def __init__(self, samples: int, seq_len: int, vocab_size: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab_size, (samples, seq_len), generator=gen)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index].clone()}


def random_tokens(batch_size: int = 4, seq_len: int = 32, vocab_size: int = 128,
                  num_batches: int = 4, seed: int = 0) -> DataLoader:
    """``num_batches`` batches per rank of ``{"input_ids", "labels"}``, each
    ``[batch_size, seq_len]`` (distinct samples per rank: ``cadence.dist.get_sampler``)."""
    from cadence import dist

    dataset = _RandomTokens(num_batches * batch_size * dist.get_world_size(), seq_len,
                            vocab_size, seed)
    return DataLoader(dataset, batch_size=batch_size, sampler=dist.get_sampler(dataset))
