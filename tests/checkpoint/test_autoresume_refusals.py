"""Autoresume that can resume (issue 10, item 5): a run file without ``run_name`` gets a
stable name under autoresume, so a relaunch continues; an autoresume into a folder that holds
another run's checkpoints is refused at start, naming that run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch.utils.data import DataLoader

from cadence import Trainer
from cadence.cli import main
from cadence.checkpoint import read_metadata
from cadence.config.load import load_config
from tests.common.models import SimpleModel, make_dataloader


def tiny_loader(batch_size: int) -> DataLoader:
    """4 batches of a fixed classification dataset (a ``train_loader`` by dotted path)."""
    return make_dataloader(num_batches=4, batch_size=batch_size)


def run_file(tmp_path: Path, folder: Path, **extra: Any) -> Path:
    config: dict[str, Any] = {
        "seed": 1, "max_duration": "2ba", "global_train_batch_size": 4, "progress_bar": False,
        "device": "cpu", "model": {"name": "tests.common.models.SimpleModel"},
        "train_loader": {"name": "tests.checkpoint.test_autoresume_refusals.tiny_loader"},
        "save_folder": str(folder), "save_interval": "1ba", "autoresume": True, **extra}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_autoresume_run_name_defaults_to_the_file_stem(tmp_path: Path) -> None:
    path = run_file(tmp_path, tmp_path / "runs")
    assert load_config(path).run_name == "exp" == load_config(path).run_name
    stamped = load_config(path, ["autoresume=false"]).run_name
    assert stamped is not None and stamped.startswith("exp-") and stamped != "exp"
    assert load_config(path, ["run_name=mine"]).run_name == "mine"


def test_relaunch_of_the_same_file_resumes(tmp_path: Path) -> None:
    folder = tmp_path / "runs"
    path = run_file(tmp_path, folder)
    assert main(["train", str(path)]) == 0
    first = (folder / "ep0-ba2-rank0.pt").read_bytes()
    assert main(["train", str(path), "max_duration=4ba"]) == 0  # continues at batch 2
    assert (folder / "latest-exp").read_text().strip() == "ep0-ba4-rank0.pt"
    assert read_metadata(folder / "ep0-ba4-rank0.pt")["run_name"] == "exp"
    assert (folder / "ep0-ba2-rank0.pt").read_bytes() == first  # not trained again, not rewritten
    extra = torch.load(folder / "ep0-ba3-rank0.pt", weights_only=True)
    assert extra["state"]["timestamp"]["Timestamp"]["batch"] == 3


def test_autoresume_into_another_runs_folder_is_refused_at_start(tmp_path: Path) -> None:
    """The reported case: a run without autoresume (a timestamped name), relaunched with it."""
    folder = tmp_path / "runs"
    path = run_file(tmp_path, folder)
    assert main(["train", str(path), "autoresume=false"]) == 0
    other = read_metadata(folder / "ep0-ba2-rank0.pt")["run_name"]
    assert other.startswith("exp-")
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    with pytest.raises(ValueError) as info:
        main(["train", str(path), "max_duration=4ba"])
    message = str(info.value)
    assert repr(other) in message and "'exp'" in message and str(folder) in message
    assert f"run_name={other}" in message and "another save_folder" in message
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before  # nothing ran


def test_names_that_cannot_collide_share_a_folder(tmp_path: Path) -> None:
    def trainer(run_name: str, filename: str, autoresume: bool) -> Trainer:
        return Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=2),
                       max_duration="2ba", save_folder=str(tmp_path), run_name=run_name,
                       save_filename=filename, save_interval="1ba", autoresume=autoresume,
                       progress_bar=False, seed=0)
    first = trainer("alpha", "{run_name}-ba{batch}", autoresume=False)
    first.fit()
    first.close()
    with pytest.raises(ValueError, match="'alpha'.*alpha-ba1.pt"):  # would write alpha-ba1.pt
        trainer("beta", "alpha-ba{batch}", autoresume=True)
    second = trainer("beta", "{run_name}-ba{batch}", autoresume=True)  # cannot collide
    second.fit()
    second.close()
    assert (tmp_path / "beta-ba2.pt").is_file() and (tmp_path / "alpha-ba2.pt").is_file()


def test_trainer_autoresume_needs_an_explicit_run_name(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CADENCE_RUN_NAME", "COMPOSER_RUN_NAME", "RUN_NAME"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="explicit run_name"):
        Trainer(model=SimpleModel(), train_dataloader=make_dataloader(), max_duration="1ba",
                save_folder=str(tmp_path), autoresume=True, progress_bar=False)
    assert not any(tmp_path.iterdir())
