"""Tiny models, data and Trainer runs shared by the algorithm tests."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, Dataset

from cadence import Trainer, dist
from cadence.models.gpt import gpt2

__all__ = ["SEQ", "VOCAB", "CountingTokens", "tiny_gpt", "token_loader", "run_trainer",
           "full", "local"]

SEQ = 16
VOCAB = 64


class CountingTokens(Dataset):
    """Counting sequences from random starts (the next token is the last plus one), so a
    tiny GPT learns; ``{"input_ids", "labels"}: [SEQ]`` int64."""

    def __init__(self, num_samples: int = 32, seed: int = 1234, seq_len: int = SEQ,
                 vocab_size: int = VOCAB) -> None:
        gen = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, vocab_size, (num_samples, 1), generator=gen)
        self.ids = (starts + torch.arange(seq_len)) % vocab_size

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def tiny_gpt(n_layer: int = 2, dropout: float = 0.0, seed: int = 0) -> Any:
    """A 2-layer, width-32 GPT-2 (about 30 k parameters), seeded."""
    torch.manual_seed(seed)
    return gpt2(n_layer=n_layer, n_head=2, n_embd=32, vocab_size=VOCAB, max_seq_len=SEQ,
                dropout=dropout)


def token_loader(global_batch: int = 8, num_samples: int = 32, seed: int = 1234) -> DataLoader:
    """``num_samples`` counting sequences, ``global_batch / world_size`` per rank, in order."""
    dataset = CountingTokens(num_samples, seed)
    return DataLoader(dataset, batch_size=global_batch // dist.get_world_size(),
                      sampler=dist.get_sampler(dataset, shuffle=False))


def run_trainer(model: Any, algorithms: Sequence[Any] = (), steps: int = 4,
                parallelism_config: Optional[dict[str, Any]] = None, fit: bool = True,
                **kwargs: Any) -> Trainer:
    """A Trainer on :func:`token_loader` with AdamW(lr=1e-2), fitted for ``steps`` batches."""
    kwargs.setdefault("train_dataloader", token_loader())
    trainer = Trainer(model=model, max_duration=f"{steps}ba",
                      optimizers=torch.optim.AdamW(model.parameters(), lr=1e-2),
                      algorithms=list(algorithms), progress_bar=False, seed=0, device="cpu",
                      parallelism_config=parallelism_config, **kwargs)
    if fit:
        trainer.fit()
    return trainer


def full(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor gathered to a plain tensor (collective), or the tensor itself (detached)."""
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach()


def local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard, or the tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor
