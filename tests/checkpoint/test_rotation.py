"""Rotation keeps exactly ``save_num_checkpoints_to_keep`` checkpoints (also across a resume),
the ``latest`` pointer names the newest, and ``save_overwrite`` guards existing checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from cadence import Trainer
from cadence.callbacks.checkpoint_saver import CheckpointSaver
from cadence.checkpoint import is_complete
from tests.common.events import StopAt
from tests.common.models import SimpleModel, make_dataloader

RUN = "rot"
LATEST = f"latest-{RUN}"
SYMLINK = "latest-rank0.pt"  # Composer's name for the newest full checkpoint


def train(folder: Path, fmt: str = "full", keep: int = 2, seed: int = 1, stop_at: int = 0,
          **kwargs: Any) -> Trainer:
    """6 batches (one epoch), a checkpoint after every batch."""
    torch.manual_seed(seed)
    trainer = Trainer(
        model=SimpleModel(), train_dataloader=make_dataloader(num_batches=6),
        max_duration="6ba", progress_bar=False, run_name=RUN, seed=seed,
        callbacks=[StopAt(stop_at)] if stop_at else [], save_folder=str(folder),
        save_interval="1ba", save_num_checkpoints_to_keep=keep, save_state_dict_type=fmt,
        **kwargs)
    trainer.fit()
    trainer.close()
    return trainer


def names(fmt: str, *batches: int) -> set[str]:
    return {f"ep0-ba{b}" + ("-rank0.pt" if fmt == "full" else "") for b in batches}


@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_keeps_exactly_n_and_points_at_newest(tmp_path: Path, fmt: str) -> None:
    train(tmp_path, fmt, keep=2)
    links = {SYMLINK} if fmt == "full" else set()
    assert {p.name for p in tmp_path.iterdir()} == names(fmt, 5, 6) | {LATEST} | links
    assert (tmp_path / LATEST).read_text().strip() == f"ep0-ba6{'-rank0.pt' if fmt == 'full' else ''}"
    assert all(is_complete(tmp_path / n) for n in names(fmt, 5, 6))


def test_keep_all_by_default(tmp_path: Path) -> None:
    train(tmp_path, keep=-1)
    assert {p.name for p in tmp_path.iterdir()} == names("full", *range(1, 7)) | {LATEST, SYMLINK}


def test_rotation_continues_after_autoresume(tmp_path: Path) -> None:
    """The resumed run also removes what the first run wrote (the list is checkpointed)."""
    train(tmp_path, keep=2, stop_at=3)
    assert {p.name for p in tmp_path.iterdir()} == names("full", 2, 3) | {LATEST, SYMLINK}
    trainer = train(tmp_path, keep=2, autoresume=True)
    assert trainer.state.timestamp.batch == 6
    assert {p.name for p in tmp_path.iterdir()} == names("full", 5, 6) | {LATEST, SYMLINK}


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)["state"]["model"]


@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_trainer_refuses_a_folder_with_a_checkpoint(tmp_path: Path, fmt: str) -> None:
    train(tmp_path, fmt, keep=1)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ValueError, match="already holds checkpoint") as info:
        train(tmp_path, fmt, keep=1, seed=2)
    message = str(info.value)
    assert str(tmp_path) in message and "save_overwrite=True" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_saver_refuses_to_clobber(tmp_path: Path) -> None:
    train(tmp_path, keep=-1)
    path = tmp_path / "ep0-ba6-rank0.pt"
    data = path.read_bytes()
    torch.manual_seed(5)  # another run, stopped at batch 6 mid-epoch: it would save ep0-ba6
    other = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=12),
                    max_duration="6ba", progress_bar=False, run_name=RUN, seed=5)
    other.fit()
    saver = CheckpointSaver(folder=str(tmp_path), save_interval="1ba", overwrite=False)
    with pytest.raises(FileExistsError) as info:
        saver.save(other.state)
    assert str(path) in str(info.value) and "save_overwrite=True" in str(info.value)
    assert path.read_bytes() == data
    assert not list(tmp_path.glob("*.tmp-*"))
    other.close()


@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_overwrite_replaces(tmp_path: Path, fmt: str) -> None:
    first = train(tmp_path, fmt, keep=-1, seed=1)
    second = train(tmp_path, fmt, keep=-1, seed=2, save_overwrite=True)
    links = {SYMLINK} if fmt == "full" else set()
    assert {p.name for p in tmp_path.iterdir()} == names(fmt, *range(1, 7)) | {LATEST} | links
    assert not list(tmp_path.glob("*.tmp-*"))
    final = tmp_path / ("ep0-ba6-rank0.pt" if fmt == "full" else "ep0-ba6")
    from cadence.checkpoint.export import load_full_state

    saved = load_full_state(final)["model"]
    for name, param in second.state.model.state_dict().items():
        assert torch.equal(saved[name], param), name
    assert not all(torch.equal(saved[n], p) for n, p in first.state.model.state_dict().items())
