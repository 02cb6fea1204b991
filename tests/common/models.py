"""Tiny models and data for tests."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
import torchmetrics
from torch.utils.data import DataLoader, TensorDataset

from cadence import ComposerModel

__all__ = ["SimpleModel", "make_dataloader"]


class SimpleModel(ComposerModel):
    """A 2-layer MLP classifier: ``x [batch, in_features] -> logits [batch, num_classes]``."""

    def __init__(self, in_features: int = 8, num_classes: int = 3, hidden: int = 16) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(in_features, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, num_classes)
        )
        self.num_classes = num_classes

    def forward(self, batch: Any) -> torch.Tensor:
        return self.net(batch[0])

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return F.cross_entropy(outputs, batch[1])

    def get_metrics(self, is_train: bool = False) -> dict[str, Any]:
        return {"MulticlassAccuracy": torchmetrics.classification.MulticlassAccuracy(
            num_classes=self.num_classes, average="micro")}


def make_dataloader(num_batches: int = 3, batch_size: int = 4, in_features: int = 8,
                    num_classes: int = 3, seed: int = 0) -> DataLoader:
    """A deterministic classification dataloader of exactly ``num_batches`` batches."""
    gen = torch.Generator().manual_seed(seed)
    n = num_batches * batch_size
    x = torch.randn(n, in_features, generator=gen)
    y = torch.randint(0, num_classes, (n,), generator=gen)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=False)
