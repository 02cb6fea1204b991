"""The asynchronous checkpoint's own gloo process group times out after the run's
``dist_timeout``, as the training loop's collectives do (not torch's 30-minute default for
a new gloo group), also when the default group was created before the Trainer."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from cadence import Trainer, dist
from cadence.callbacks.checkpoint_saver import CheckpointSaver
from tests.common.models import SimpleModel

DIST_TIMEOUT = 37.0  # seconds; torch's default for a new gloo group is 1800


def group_timeout(group: torch.distributed.ProcessGroup) -> datetime.timedelta:
    """The timeout a gloo group's collectives run under (torch keeps it on the backend's
    options; there is no public getter)."""
    return group._get_backend(torch.device("cpu")).options._timeout


@pytest.mark.world_size(2)
def test_async_checkpoint_group_uses_dist_timeout(tmp_path: Path) -> None:
    data = TensorDataset(torch.randn(8, 8), torch.randint(0, 3, (8,)))
    loader = DataLoader(data, batch_size=2, sampler=dist.get_sampler(data, shuffle=False))
    trainer = Trainer(model=SimpleModel(), train_dataloader=loader, max_duration="2ba",
                      progress_bar=False, run_name="timeout", save_folder=str(tmp_path),
                      save_interval="1ba", save_async=True, dist_timeout=DIST_TIMEOUT,
                      parallelism_config={"fsdp": {"state_dict_type": "sharded"}})
    trainer.fit()
    saver = next(c for c in trainer.state.callbacks if isinstance(c, CheckpointSaver))
    group = saver._async._group  # made at the first save
    assert group is not None
    assert group_timeout(group) == datetime.timedelta(seconds=DIST_TIMEOUT)
    trainer.close()
    assert (tmp_path / "latest-timeout").read_text().strip().endswith("-ba2")  # saves finished
