"""Autoresume only picks up checkpoints of its own run, even without the latest pointer."""

from __future__ import annotations

from pathlib import Path

from cadence import Trainer
from tests.common.models import SimpleModel, make_dataloader


def trainer(folder: Path, run_name: str, duration: str, autoresume: bool = False) -> Trainer:
    return Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=3),
                   max_duration=duration, save_folder=str(folder), run_name=run_name,
                   save_interval="1ba", autoresume=autoresume, progress_bar=False, seed=0,
                   save_filename="{run_name}-ba{batch}")


def test_fallback_scan_filters_by_run_name(tmp_path: Path) -> None:
    first = trainer(tmp_path, "alpha", "2ba")
    first.fit()
    other = trainer(tmp_path, "beta", "3ba")
    other.fit()  # newer checkpoints, another run
    for pointer in tmp_path.glob("latest-*"):
        pointer.unlink()  # as if the pointers were lost
    resumed = trainer(tmp_path, "alpha", "3ba", autoresume=True)
    assert resumed.state.timestamp.batch == 2  # alpha's own ba2, not beta's ba3
    fresh = trainer(tmp_path, "gamma", "1ba", autoresume=True)
    assert fresh.state.timestamp.batch == 0
