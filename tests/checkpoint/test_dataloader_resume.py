"""Exact mid-epoch resume with the everyday DataLoader (issue 10, item 3).

Each test trains without interruption, then stops a second run mid-epoch and autoresumes it
in a new Trainer. The losses (dropout on, so they also depend on the global RNG stream
after the resume) must be ``==``, every batch must hold the same samples (and, with
workers, come from workers seeded alike), and the interrupted epoch must see every sample
of the dataset exactly once.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from cadence import Callback, State, Trainer
from tests.common.events import StopAt
from tests.common.models import SimpleModel

#: torchdata 0.11's StatefulDataLoader calls torch.set_vital, which torch 2.13 deprecates.
STATEFUL_WARNING = "ignore:'set_vital' is deprecated:UserWarning"

SAMPLES, BATCH = 24, 4
PER_EPOCH = SAMPLES // BATCH  # 6 batches
TOTAL = 3 * PER_EPOCH


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    return torch.randn(SAMPLES, 8, generator=gen), torch.randint(0, 3, (SAMPLES,), generator=gen)


class Indexed(Dataset):
    """``(x [8], y, index, worker seed mod 1000003 (-1 in the main process))``."""

    def __init__(self) -> None:
        self.x, self.y = _data()

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        info = get_worker_info()
        return self.x[i], self.y[i], i, -1 if info is None else info.seed % 1000003


class Stream(IterableDataset):
    """An iterable dataset with its own state: a new permutation every epoch."""

    def __init__(self) -> None:
        self.x, self.y = _data()
        self.epoch, self.pos = 0, 0
        self.order: Optional[list[int]] = None

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, int, int]]:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        if self.pos >= SAMPLES:
            self.epoch, self.pos, self.order = self.epoch + 1, 0, None
            raise StopIteration
        if self.order is None:
            gen = torch.Generator().manual_seed(100 + self.epoch)
            self.order = torch.randperm(SAMPLES, generator=gen).tolist()
        i = self.order[self.pos]
        self.pos += 1
        return self.x[i], self.y[i], i, -1

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.pos, self.order = state["epoch"], state["pos"], None


class DropoutModel(SimpleModel):
    """SimpleModel with dropout on its logits: its loss depends on the global torch RNG."""

    def forward(self, batch: Any) -> torch.Tensor:
        return F.dropout(self.net(batch[0]), 0.3, self.training)


class Seen(Callback):
    """Records ``(epoch, indices, worker seeds)`` and the loss of every trained batch."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, list[int], list[int]]] = []
        self.losses: dict[int, float] = {}

    def batch_end(self, state: State, logger: Any) -> None:
        batch = state.batch
        self.batches.append((int(state.timestamp.epoch), batch[2].tolist(), batch[3].tolist()))
        assert state.total_loss is not None
        self.losses[int(state.timestamp.batch)] = float(state.total_loss)


class Interrupted(Exception):
    pass


class CrashAtEpochStart(Callback):
    """Raises at EPOCH_START of ``epoch``: the last checkpoint is the epoch boundary's."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def epoch_start(self, state: State, logger: Any) -> None:
        if int(state.timestamp.epoch) == self.epoch:
            raise Interrupted


def run(folder: Path, make_loader: Callable[[], Any], stop_at: Optional[int] = None,
        autoresume: bool = False, boundary: bool = False) -> tuple[dict[int, float], list[Any]]:
    """Train ``TOTAL`` batches (or stop after batch ``stop_at``: there, or with ``boundary``
    at the epoch boundary that follows it, a checkpoint is saved); the loss by step and the
    batches seen."""
    torch.manual_seed(0)
    model = DropoutModel()
    seen = Seen()
    callbacks: list[Callback] = [seen]
    if stop_at is not None:
        callbacks.append(CrashAtEpochStart(stop_at // PER_EPOCH) if boundary else StopAt(stop_at))
    trainer = Trainer(
        model=model, train_dataloader=make_loader(), max_duration=f"{TOTAL}ba", seed=11,
        optimizers=torch.optim.AdamW(model.parameters(), lr=1e-2),
        callbacks=callbacks, progress_bar=False, run_name="dl", save_folder=str(folder),
        save_interval="1ep" if boundary else "100ba", autoresume=autoresume)
    try:
        trainer.fit()
    except Interrupted:
        pass
    trainer.close()
    return seen.losses, seen.batches


#: where a run is cut: after batch n, mid-epoch / at the last batch of an epoch (a batch
#: checkpoint) / at the epoch boundary (the epoch's checkpoint, at ``batch_in_epoch == 0``)
CUTS = pytest.mark.parametrize("stop_at, boundary", [
    (PER_EPOCH + 3, False), (2 * PER_EPOCH, False), (2 * PER_EPOCH, True)],
    ids=["mid_epoch", "last_batch", "epoch_boundary"])


def check_exact(tmp_path: Path, make_loader: Callable[[], Any], stop_at: int,
                boundary: bool = False) -> None:
    full_losses, full_seen = run(tmp_path / "full", make_loader)
    assert len(full_losses) == TOTAL
    first_losses, first_seen = run(tmp_path / "cut", make_loader, stop_at=stop_at,
                                   boundary=boundary)
    assert max(first_losses) == stop_at
    resumed_losses, resumed_seen = run(tmp_path / "cut", make_loader, autoresume=True)
    assert min(resumed_losses) == stop_at + 1 and max(resumed_losses) == TOTAL
    assert first_seen + resumed_seen == full_seen  # same samples, same worker seeds, same order
    assert {**first_losses, **resumed_losses} == full_losses  # bit for bit
    epoch = (stop_at - 1) // PER_EPOCH  # the epoch of the last batch before the cut
    in_epoch = [i for e, indices, _ in first_seen + resumed_seen if e == epoch for i in indices]
    assert sorted(in_epoch) == list(range(SAMPLES))  # every sample once: none twice, none lost


def shuffled(num_workers: int, persistent: bool = False) -> Callable[[], DataLoader]:
    return lambda: DataLoader(Indexed(), batch_size=BATCH, shuffle=True,
                              num_workers=num_workers, persistent_workers=persistent)


def test_shuffle_true_resumes_mid_epoch(tmp_path: Path) -> None:
    check_exact(tmp_path, shuffled(0), stop_at=PER_EPOCH + 2)


def test_shuffle_true_two_workers_resumes_mid_epoch(tmp_path: Path) -> None:
    check_exact(tmp_path, shuffled(2), stop_at=PER_EPOCH + 2)


def test_persistent_workers_resume_mid_epoch(tmp_path: Path) -> None:
    check_exact(tmp_path, shuffled(2, persistent=True), stop_at=PER_EPOCH + 2)


@CUTS
def test_user_generator_resumes(tmp_path: Path, stop_at: int, boundary: bool) -> None:
    def make() -> DataLoader:
        return DataLoader(Indexed(), batch_size=BATCH, shuffle=True,
                          generator=torch.Generator().manual_seed(5))
    check_exact(tmp_path, make, stop_at=stop_at, boundary=boundary)


@pytest.mark.filterwarnings(STATEFUL_WARNING)
@CUTS
def test_stateful_dataloader_iterable_resumes_without_replay(tmp_path: Path, stop_at: int,
                                                              boundary: bool) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    datasets: list[Stream] = []

    def make() -> StatefulDataLoader:
        datasets.append(Stream())
        return StatefulDataLoader(datasets[-1], batch_size=BATCH)
    check_exact(tmp_path, make, stop_at=stop_at, boundary=boundary)
    checkpoint = torch.load(next((tmp_path / "cut").glob("*.pt")), weights_only=True)
    assert checkpoint["state"]["data"][0]["kind"] == "stateful"


@pytest.mark.filterwarnings(STATEFUL_WARNING)
@CUTS
def test_stateful_dataloader_map_style_shuffle_resumes(tmp_path: Path, stop_at: int,
                                                       boundary: bool) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    check_exact(tmp_path, lambda: StatefulDataLoader(Indexed(), batch_size=BATCH, shuffle=True),
                stop_at=stop_at, boundary=boundary)


class GlobalShuffled(IterableDataset):
    """An iterable dataset that shuffles with the global torch RNG when iterated."""

    def __init__(self) -> None:
        self.x, self.y = _data()

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, int, int]]:
        for i in torch.randperm(SAMPLES).tolist():
            yield self.x[i], self.y[i], i, -1


def test_iterable_dataset_dataloader_is_replayed_from_the_recorded_rng(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """No sampler to skip with: the consumed batches are loaded again (warned), from the RNG
    state the epoch started with, so the order is the uninterrupted run's."""
    with caplog.at_level(logging.WARNING, logger="cadence.checkpoint.data_position"):
        check_exact(tmp_path, lambda: DataLoader(GlobalShuffled(), batch_size=BATCH),
                    stop_at=PER_EPOCH + 3)
    assert "replaying 3 batches" in caplog.text


def test_rebuilt_loader_keeps_every_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both ways of skipping consumed batches without loading them (the epoch recreated from
    the recorded RNG states, and the fallback without a record) rebuild the loader with its
    arguments; the fallback once dropped ``prefetch_factor`` and ``multiprocessing_context``."""
    import multiprocessing
    from types import SimpleNamespace

    from cadence.checkpoint import data_position

    context = multiprocessing.get_context("fork")
    rebuilt: list[DataLoader] = []
    rebuild = data_position.rebuild_dataloader

    def recording(*args: Any, **kwargs: Any) -> DataLoader:
        rebuilt.append(rebuild(*args, **kwargs))
        return rebuilt[-1]

    def make() -> DataLoader:
        return DataLoader(Indexed(), batch_size=BATCH, shuffle=True, num_workers=1,
                          prefetch_factor=3, multiprocessing_context=context,
                          generator=torch.Generator().manual_seed(1))

    monkeypatch.setattr(data_position, "rebuild_dataloader", recording)
    fallback = make()  # no recorded position (an older checkpoint): skip_consumed_batches
    rest, length = data_position.iter_epoch(fallback, 0, 2, len(fallback))
    assert length == PER_EPOCH - 2 and len(list(rest)) == PER_EPOCH - 2
    exact = make()  # a recorded position: the epoch is recreated, then skipped into
    state = SimpleNamespace(train_dataloader=exact)
    epoch = [batch[2] for batch in data_position.iter_epoch(exact, 0, 0, len(exact))[0]]
    data_position.load_data_position(state, data_position.save_data_position(state))
    rest, length = data_position.iter_epoch(exact, 0, 2, len(exact))
    assert length == PER_EPOCH - 2
    assert [batch[2].tolist() for batch in rest] == [b.tolist() for b in epoch[2:]]
    assert len(rebuilt) == 2
    for loader in rebuilt:
        assert loader.num_workers == 1 and loader.prefetch_factor == 3
        assert loader.multiprocessing_context is context


class InOrder(IterableDataset):
    """An iterable dataset without state, in index order (sized, as streaming's are)."""

    def __init__(self) -> None:
        self.x, self.y = _data()

    def __len__(self) -> int:
        return SAMPLES

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, int, int]]:
        for i in range(SAMPLES):
            yield self.x[i], self.y[i], i, -1


def test_iterable_dataset_without_a_record_is_replayed(caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    """A DataLoader over an IterableDataset resumed mid-epoch without a recorded position
    (an older checkpoint, another number of ranks): its batch sampler's sampler has no
    length and no indices to skip, so the consumed batches are replayed (warned); this once
    raised ``TypeError`` (``len()`` of torch's ``_InfiniteConstantSampler``)."""
    from cadence.checkpoint import data_position

    loader = DataLoader(InOrder(), batch_size=BATCH)
    with caplog.at_level(logging.WARNING, logger="cadence.checkpoint.data_position"):
        rest, length = data_position.iter_epoch(loader, 0, 2, len(loader))
        batches = [batch[2].tolist() for batch in rest]
    assert length == PER_EPOCH - 2
    assert batches == [list(range(b * BATCH, (b + 1) * BATCH)) for b in range(2, PER_EPOCH)]
    assert "replaying 2 batches" in caplog.text
