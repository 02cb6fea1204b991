"""A train dataloader that keeps its own position (``state_dict`` / ``load_state_dict``,
duck-typed as Composer does; mosaicml-streaming's ``StreamingDataLoader`` is one): its state
is saved in the checkpoint and restored on resume, so a run cut mid-epoch, at an epoch's last
batch or at an epoch boundary continues bit for bit, and the resumed loader loads no
consumed sample again.

``Streamingish`` follows streaming 0.12's contract (``StreamingDataset.state_dict(num_samples,
from_beginning)`` / ``load_state_dict``, ``StreamingDataLoader`` counting the samples it
yielded): mosaicml-streaming itself cannot be installed beside cadence's pins (README,
"Coming from llm-foundry")."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator, Optional

import torch
from torch.utils.data import DataLoader, IterableDataset

import pytest

from cadence.checkpoint.data_position import (
    _tracker, has_dataset_state, has_loader_state, load_data_position,
)
from cadence.utils import dist
from tests.checkpoint.test_dataloader_resume import BATCH, CUTS, SAMPLES, _data, check_exact


class EpochStream(IterableDataset):
    """Streaming's dataset contract: each epoch a seeded permutation of the samples; after
    ``load_state_dict({'epoch', 'sample_in_epoch'})`` the next ``iter()`` continues that
    epoch from that sample (the next epoch when it was over). ``loaded`` counts the samples
    read (a resume must not read the consumed ones again)."""

    def __init__(self) -> None:
        self.x, self.y = _data()
        self.next_epoch, self.epoch, self.offset = 0, 0, 0
        self._resume: Optional[dict[str, int]] = None
        self.loaded = 0

    def __len__(self) -> int:  # streaming's datasets are sized
        return SAMPLES

    #: the permutation of epoch ``e`` is seeded ``SEED + e``
    SEED = 50

    def _epoch_order(self) -> list[int]:
        """Start the next epoch (or the one ``load_state_dict`` named, after its consumed
        samples): the sample indices still to read, in the epoch's order."""
        epoch, start = self.next_epoch, 0
        if self._resume is not None:
            epoch, start = self._resume["epoch"], self._resume["sample_in_epoch"]
            if start >= SAMPLES:
                epoch, start = epoch + 1, 0
            self._resume = None
        self.epoch, self.offset, self.next_epoch = epoch, start, epoch + 1
        seed = torch.Generator().manual_seed(self.SEED + epoch)
        return torch.randperm(SAMPLES, generator=seed).tolist()[start:]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, int, int]]:
        for i in self._epoch_order():
            self.loaded += 1
            yield self.x[i], self.y[i], i, -1

    def state_dict(self, num_samples: int, from_beginning: bool) -> dict[str, int]:
        done = num_samples if from_beginning else self.offset + num_samples
        return {"epoch": self.epoch, "sample_in_epoch": done}

    def load_state_dict(self, obj: dict[str, int]) -> None:
        self._resume = dict(obj)


class Streamingish(DataLoader):
    """Streaming's ``StreamingDataLoader``: counts the samples it yielded; its state is its
    dataset's, in global samples (times the world size)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.num_samples_yielded = 0

    def __iter__(self) -> Iterator[Any]:
        self.num_samples_yielded = 0
        for batch in super().__iter__():
            self.num_samples_yielded += len(batch[2])
            yield batch

    def state_dict(self) -> dict[str, int]:
        return self.dataset.state_dict(self.num_samples_yielded * dist.get_world_size(), False)

    def load_state_dict(self, obj: dict[str, int]) -> None:
        self.dataset.load_state_dict(obj)


@CUTS
def test_a_loader_with_its_own_state_resumes_exactly_without_replay(
        tmp_path: Path, stop_at: int, boundary: bool) -> None:
    datasets: list[EpochStream] = []

    def make() -> Streamingish:
        datasets.append(EpochStream())
        return Streamingish(datasets[-1], batch_size=BATCH)

    check_exact(tmp_path, make, stop_at=stop_at, boundary=boundary)
    checkpoint = torch.load(next((tmp_path / "cut").glob("*.pt")), weights_only=True)
    (entry,) = checkpoint["state"]["data"]
    assert entry["kind"] == "loader_state"
    resumed = datasets[-1]
    total = 3 * SAMPLES
    assert resumed.loaded == total - stop_at * BATCH  # nothing read twice after the resume


@pytest.mark.parametrize("stop_at", [9, 12], ids=["mid_epoch", "last_batch"])
def test_a_plain_dataloader_over_a_dataset_with_state_resumes_without_replay(
        tmp_path: Path, stop_at: int) -> None:
    """llm-foundry's way: a plain ``DataLoader`` over a ``StreamingDataset``; Composer's rule
    saves ``dataset.state_dict(sample_in_epoch, True)`` and restores it."""
    datasets: list[EpochStream] = []

    def make() -> DataLoader:
        datasets.append(EpochStream())
        return DataLoader(datasets[-1], batch_size=BATCH)

    check_exact(tmp_path, make, stop_at=stop_at)
    checkpoint = torch.load(next((tmp_path / "cut").glob("*.pt")), weights_only=True)
    (entry,) = checkpoint["state"]["data"]
    assert entry["kind"] == "dataset_state"
    assert entry["state"]["sample_in_epoch"] == (stop_at - 6) * BATCH
    assert datasets[-1].loaded == 3 * SAMPLES - stop_at * BATCH  # nothing read twice


def test_duck_typing_and_another_number_of_ranks() -> None:
    assert has_dataset_state(DataLoader(EpochStream(), batch_size=BATCH))
    assert has_loader_state(Streamingish(EpochStream(), batch_size=BATCH))
    assert not has_loader_state(DataLoader(list(range(4))))
    loader = Streamingish(EpochStream(), batch_size=BATCH)
    state = SimpleNamespace(train_dataloader=loader)
    saved = [{"kind": "loader_state", "state": {"epoch": 1, "sample_in_epoch": 8}},
             {"kind": "loader_state", "state": {"epoch": 1, "sample_in_epoch": 8}}]
    load_data_position(state, saved)  # 2 ranks saved, 1 resumes: rank 0's (global) state
    tracker = _tracker(loader)
    assert tracker is not None and tracker.restored == saved[0]
