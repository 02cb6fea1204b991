"""Issue 25, item 1: a truncated newest checkpoint does not trap autoresume. Autoresume
rejects it, falls back to the previous one, moves the rejected one aside
(``<name>.rejected-<time>``, never deleted) and says so; the run then saves that batch again
instead of dying with ``FileExistsError``, and every later relaunch resumes too."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from cadence import Trainer
from cadence.checkpoint.files import REJECTED_MARK, is_complete
from cadence.checkpoint.store import find_latest_checkpoint
from tests.common.models import SimpleModel, make_dataloader

RUN = "aside"
LATEST = f"latest-{RUN}"


def _fit(folder: Path, batches: int, fmt: str = "full", **kwargs: Any) -> Trainer:
    torch.manual_seed(0)
    loader = DataLoader(make_dataloader(num_batches=6, batch_size=4).dataset, batch_size=4)
    trainer = Trainer(model=SimpleModel(), train_dataloader=loader,
                      max_duration=f"{batches}ba", progress_bar=False, run_name=RUN, seed=1,
                      save_folder=str(folder), save_interval="1ba", save_state_dict_type=fmt,
                      autoresume=True, **kwargs)
    try:
        trainer.fit()
    finally:
        trainer.close()
    return trainer


@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_truncated_newest_is_moved_aside_and_two_relaunches_succeed(
        tmp_path: Path, fmt: str, caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "run"
    _fit(folder, 3, fmt)
    newest = folder / ("ep0-ba3-rank0.pt" if fmt == "full" else "ep0-ba3")
    assert (folder / LATEST).read_text().strip() == newest.name
    if fmt == "full":  # cut the pointer's checkpoint to 1,000 bytes
        newest.write_bytes(newest.read_bytes()[:1000])
    else:
        shard = next(newest.glob("*.distcp"))
        shard.write_bytes(shard.read_bytes()[:1000])

    with caplog.at_level(logging.WARNING):
        first = _fit(folder, 5, fmt)  # falls back to ba2, trains 3..5, saves ba3 again
    assert first.hyperparameters["loaded_checkpoint"] == str(folder / newest.name.replace(
        "ba3", "ba2"))
    assert int(first.state.timestamp.batch) == 5
    aside = [p for p in folder.iterdir() if REJECTED_MARK in p.name]
    assert len(aside) == 1 and aside[0].name.startswith(f"{newest.name}{REJECTED_MARK}")
    message = " ".join(r.getMessage() for r in caplog.records)
    assert "moved aside, not deleted" in message and aside[0].name in message
    assert is_complete(newest)  # saved again by the resumed run, intact
    assert (folder / LATEST).read_text().strip() == newest.name.replace("ba3", "ba5")

    second = _fit(folder, 6, fmt)  # the second relaunch resumes from ba5
    assert second.hyperparameters["loaded_checkpoint"] == str(
        folder / newest.name.replace("ba3", "ba5"))
    assert int(second.state.timestamp.batch) == 6
    # the rejected copy is kept, and never taken for a checkpoint of the run
    assert aside[0].exists()
    assert find_latest_checkpoint(folder, LATEST) == folder / newest.name.replace("ba3", "ba6")
