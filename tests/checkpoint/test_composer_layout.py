"""cadence's checkpoints in Composer's layout and names, and the Composer checkpointing
arguments around them: ``save_ignore_keys``, ``save_metrics``, ``load_object_store``,
``Trainer.saved_checkpoints``, ``CheckpointSaver.all_saved_checkpoints_to_timestamp``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from cadence import Trainer
from cadence.callbacks.checkpoint_saver import CheckpointSaver
from cadence.cli import main as cli_main
from cadence.checkpoint.checkpoint import read_metadata
from cadence.checkpoint.errors import CheckpointError
from cadence.checkpoint.manifest import verify_checkpoint
from tests.common.models import SimpleModel, make_dataloader

FIXTURE = Path(__file__).parents[1] / "fixtures" / "composer_0_32_1" / "ep1-ba6-rank0.pt"


def _trainer(folder: Path, **kwargs: Any) -> Trainer:
    kwargs.setdefault("max_duration", "2ba")
    return Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=2),
                   save_folder=str(folder), save_interval="1ba", run_name="lay",
                   progress_bar=False, seed=0, **kwargs)


def _fit(folder: Path, **kwargs: Any) -> Trainer:
    trainer = _trainer(folder, **kwargs)
    trainer.fit()
    trainer.close()
    return trainer


def test_full_file_has_composers_layout_and_names(tmp_path: Path) -> None:
    trainer = _fit(tmp_path)
    path = tmp_path / "ep0-ba2-rank0.pt"
    assert trainer.saved_checkpoints == [str(tmp_path / "ep0-ba1-rank0.pt"), str(path)]
    assert os.readlink(tmp_path / "latest-rank0.pt") == path.name
    loaded = torch.load(path, weights_only=True)  # no pickled object anywhere
    assert sorted(loaded) == ["rng", "state"]
    state = loaded["state"]
    model = trainer.state.model.state_dict()
    assert all(torch.equal(state["model"][k], model[k]) for k in model)
    assert list(state["optimizers"]) == [type(trainer.state.optimizers[0]).__qualname__]
    assert state["timestamp"]["Timestamp"]["batch"] == 2
    assert isinstance(state["timestamp"]["Timestamp"]["total_wct"], float)
    assert state["run_name"] == "lay" and state["rank_zero_seed"] == 0
    assert state["metadata"]["world_size"] == 1 and "integrations" in state
    assert isinstance(state["algorithms"], list)
    assert set(loaded["rng"][0]) >= {"python", "numpy", "torch"}
    # the saver's state holds every checkpoint's timestamp, itself included, as plain data
    saver_state = state["callbacks"]["CheckpointSaver"]
    assert [n for n, _ in saver_state["all_saved_checkpoints_to_timestamp"]] == [
        "ep0-ba1-rank0.pt", "ep0-ba2-rank0.pt"]


def test_resume_restores_the_savers_timestamps(tmp_path: Path) -> None:
    _fit(tmp_path)
    resumed = _trainer(tmp_path, max_duration="3ba", autoresume=True)
    saver = next(c for c in resumed.state.callbacks if isinstance(c, CheckpointSaver))
    stamps = saver.all_saved_checkpoints_to_timestamp
    assert {n: int(t.batch) for n, t in stamps.items()} == {"ep0-ba1-rank0.pt": 1,
                                                             "ep0-ba2-rank0.pt": 2}
    resumed.fit()
    resumed.close()
    assert int(stamps["ep1-ba3-rank0.pt"].batch) == 3


def test_sharded_checkpoint_is_composers_folder(tmp_path: Path) -> None:
    trainer = _fit(tmp_path, save_state_dict_type="sharded", max_duration="1ba")
    assert (tmp_path / "ep0-ba1" / ".metadata").is_file()
    assert trainer.saved_checkpoints == [str(tmp_path / "ep0-ba1")]


def test_save_ignore_keys_leave_parts_out(tmp_path: Path) -> None:
    _fit(tmp_path, save_ignore_keys=["state/optimizers", "state/model/net.2.*", "rng"],
         max_duration="1ba")
    loaded = torch.load(tmp_path / "ep0-ba1-rank0.pt", weights_only=True)
    assert "rng" not in loaded and "optimizers" not in loaded["state"]
    assert sorted(loaded["state"]["model"]) == ["net.0.bias", "net.0.weight"]
    with pytest.raises(ValueError, match="save_ignore_keys.*sharded"):
        _trainer(tmp_path / "s", save_ignore_keys=["rng"], save_state_dict_type="sharded")


def test_save_metrics_round_trip(tmp_path: Path) -> None:
    source = _fit(tmp_path, save_metrics=True)
    metric = source.state.train_metrics["MulticlassAccuracy"]
    saved = torch.load(tmp_path / "ep0-ba2-rank0.pt", weights_only=True)["state"]
    entry = saved["train_metrics"]["MulticlassAccuracy"]["state_dict"]
    assert torch.equal(entry["tp"], metric.tp) and int(metric.tp.sum() + metric.fn.sum()) == 4
    fresh = _trainer(tmp_path / "other", load_path=str(tmp_path / "ep0-ba2-rank0.pt"))
    assert torch.equal(fresh.state.train_metrics["MulticlassAccuracy"].tp, metric.tp)
    fresh.close()
    plain = torch.load(tmp_path / "ep0-ba1-rank0.pt", weights_only=True)["state"]
    assert "train_metrics" in plain  # every save of that run
    _fit(tmp_path / "off")
    assert "train_metrics" not in torch.load(tmp_path / "off" / "ep0-ba2-rank0.pt",
                                             weights_only=True)["state"]


class FolderStore:
    """Composer's RemoteUploaderDownloader download API over a local folder."""

    def __init__(self, root: Path) -> None:
        self.root, self.downloads = root, []

    def download_file(self, remote_file_name: str, destination: str, overwrite: bool = False,
                      progress_bar: bool = True) -> None:
        self.downloads.append(remote_file_name)
        shutil.copyfile(self.root / remote_file_name, destination)


def test_load_object_store_url_and_object(tmp_path: Path) -> None:
    source = _fit(tmp_path / "bucket" / "runs")
    want = source.state.model.state_dict()
    store = FolderStore(tmp_path / "bucket")
    by_object = _trainer(tmp_path / "a", load_path="runs/ep0-ba2-rank0.pt",
                         load_object_store=store)
    assert store.downloads == ["runs/ep0-ba2-rank0.pt"]
    assert int(by_object.state.timestamp.batch) == 2
    by_object.close()
    by_url = _trainer(tmp_path / "b", load_path="runs/ep0-ba2-rank0.pt",
                      load_object_store=(tmp_path / "bucket").as_uri())
    got = by_url.state.model.state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)
    by_url.close()
    with pytest.raises(CheckpointError, match="Cannot download checkpoint 'runs/missing.pt'"):
        _trainer(tmp_path / "c", load_path="runs/missing.pt", load_object_store=store)
    with pytest.raises(TypeError, match="load_object_store"):
        _trainer(tmp_path / "d", load_path="x.pt", load_object_store=object())


def test_convert_makes_a_composer_checkpoint_cadences(tmp_path: Path) -> None:
    out = tmp_path / "converted.pt"
    assert cli_main(["convert", str(FIXTURE), "--to", "full", str(out)]) == 0
    assert verify_checkpoint(out)  # now with its checksum
    theirs = torch.load(FIXTURE, weights_only=False)["state"]["model"]
    ours = torch.load(out, weights_only=True)["state"]
    assert all(torch.equal(ours["model"][k], theirs[k]) for k in theirs)
    assert ours["timestamp"]["Timestamp"]["batch"] == 6
    assert read_metadata(out)["composer_env"]["composer_version"] == "0.32.1"
