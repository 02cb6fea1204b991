"""CheckpointSaver's Composer attributes, the latest-rank{rank}.pt symlink, and
save_num_checkpoints_to_keep=0 (upload, then keep nothing locally)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from cadence import Trainer
from cadence.callbacks.checkpoint_saver import CheckpointSaver
from cadence.core import Event
from cadence.loggers import LoggerDestination
from tests.common.models import SimpleModel, make_dataloader


def _saver(trainer: Trainer) -> CheckpointSaver:
    return next(c for c in trainer.state.callbacks if isinstance(c, CheckpointSaver))


def _run(folder: Path, **kwargs: Any) -> Trainer:
    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=2),
                      max_duration="2ba", save_folder=str(folder), save_interval="1ba",
                      run_name="ckpt", progress_bar=False, seed=0, **kwargs)
    trainer.fit()
    trainer.close()
    return trainer


def test_attributes_are_composers(tmp_path: Path) -> None:
    trainer = _run(tmp_path, save_num_checkpoints_to_keep=1, save_overwrite=True)
    saver = _saver(trainer)
    assert saver.folder == str(tmp_path) and saver.filename == "ep{epoch}-ba{batch}-rank{rank}.pt"
    assert saver.latest_filename == "latest-{run_name}"
    assert callable(saver.save_interval)
    assert saver.save_interval(trainer.state, Event.BATCH_CHECKPOINT) is True  # "1ba"
    assert saver.num_checkpoints_to_keep == 1 and saver.overwrite is True
    assert saver.weights_only is False
    assert saver.saved_checkpoints == [str(tmp_path / "ep0-ba2-rank0.pt")]
    assert not (tmp_path / "ep0-ba1-rank0.pt").exists()  # rotated out


def test_symlink_points_at_the_newest_and_autoresume_still_works(tmp_path: Path) -> None:
    _run(tmp_path)
    link = tmp_path / "latest-rank0.pt"
    assert link.is_symlink() and os.readlink(link) == "ep0-ba2-rank0.pt"
    assert torch.load(link, weights_only=False) is not None  # loads as the checkpoint
    resumed = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=2),
                      max_duration="3ba", save_folder=str(tmp_path), save_interval="1ba",
                      run_name="ckpt", progress_bar=False, seed=0, autoresume=True)
    assert int(resumed.state.timestamp.batch) == 2
    resumed.fit()
    resumed.close()
    assert os.readlink(link) == "ep1-ba3-rank0.pt"


def test_a_composer_latest_filename_names_the_symlink(tmp_path: Path) -> None:
    saver = CheckpointSaver(folder=str(tmp_path), latest_filename="latest-rank{rank}.pt")
    assert saver.symlink_filename == "latest-rank{rank}.pt"
    assert saver.latest_filename == "latest-{run_name}"


class Store(LoggerDestination):
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.names: list[str] = []

    def can_upload_files(self) -> bool:
        return True

    def upload_file(self, state: Any, remote_file_name: str, file_path: Path, *,
                    overwrite: bool) -> None:
        target = self.folder / remote_file_name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(Path(file_path).read_bytes())
        self.names.append(remote_file_name)


def test_keep_zero_uploads_then_keeps_nothing_locally(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # uploaded as Composer's Trainer names them: save_folder's path / save_filename
    monkeypatch.chdir(tmp_path)
    store = Store(tmp_path / "remote")
    trainer = _run(Path("local"), save_num_checkpoints_to_keep=0, loggers=[store])
    assert [n for n in store.names if n.startswith("local/")] == [
        "local/ep0-ba1-rank0.pt", "local/latest-rank0.pt.symlink",
        "local/ep0-ba2-rank0.pt", "local/latest-rank0.pt.symlink"]
    # Composer's remote "symlink": a text file naming the newest uploaded checkpoint
    assert (tmp_path / "remote" / "local/latest-rank0.pt.symlink").read_text() == (
        "local/ep0-ba2-rank0.pt")
    assert not list((tmp_path / "local").glob("ep*.pt"))
    assert _saver(trainer).saved_checkpoints == []
    uploaded = torch.load(tmp_path / "remote" / "local/ep0-ba2-rank0.pt", weights_only=False)
    assert uploaded is not None


def test_uploaded_names_follow_composers_trainer_rule(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Composer's docs (checkpointing.rst): ``save_folder='checkpoints'``,
    ``save_filename='ep{epoch}.pt'`` and an uploading logger put ``checkpoints/ep1.pt`` in
    the store, which ``load_path='checkpoints/ep1.pt'`` with that store then reads."""
    monkeypatch.chdir(tmp_path)
    store = Store(tmp_path / "remote")
    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=2),
                      max_duration="2ep", save_folder="checkpoints", save_filename="ep{epoch}.pt",
                      save_interval="1ep", save_num_checkpoints_to_keep=0, loggers=[store],
                      progress_bar=False)
    trainer.fit()
    trainer.close()
    assert [n for n in store.names if n.startswith("checkpoints/")] == [
        "checkpoints/ep1.pt", "checkpoints/latest-rank0.pt.symlink",
        "checkpoints/ep2.pt", "checkpoints/latest-rank0.pt.symlink"]
    assert not list((tmp_path / "checkpoints").glob("ep*.pt"))


def test_saved_checkpoints_join_the_folder_as_given(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Composer's docs: ``save_folder='./path/to/checkpoints', save_filename='ep{epoch}.pt'``
    gives ``trainer.saved_checkpoints == ['./path/to/checkpoints/ep1.pt']``."""
    monkeypatch.chdir(tmp_path)
    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(2),
                      max_duration="1ep", save_folder="./path/to/checkpoints",
                      save_filename="ep{epoch}.pt", save_interval="1ep", progress_bar=False)
    trainer.fit()
    trainer.close()
    assert trainer.saved_checkpoints == ["./path/to/checkpoints/ep1.pt"]
    assert (tmp_path / "path" / "to" / "checkpoints" / "ep1.pt").is_file()
