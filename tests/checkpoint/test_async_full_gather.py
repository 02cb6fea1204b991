"""The asynchronous ``full`` save on two FSDP2 ranks gathers the shards to rank 0 in the
writer thread, not in the loop: its checkpoints equal the synchronous save's tensor for tensor
(model and optimizer, with uneven and empty shards) and resume bit-exactly."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from cadence.checkpoint import async_save
from cadence.checkpoint.cpu_staging import _check_tiling
from cadence.checkpoint.export import load_full_state
from cadence.checkpoint.manifest import verify_checkpoint
from tests.common.models import SimpleModel
from tests.checkpoint.test_async_save import Losses, tensors, two_rank_run


class OddModel(SimpleModel):
    """SimpleModel with a 5-wide hidden layer (``[5, 8]``, ``[5]``, ``[3, 5]``: 3 + 2 rows
    on two ranks) and a ``[1, 3]`` logit scale (rank 1's shard of it is empty)."""

    def __init__(self) -> None:
        super().__init__(hidden=5)
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, 3).unsqueeze(0))

    def forward(self, batch: Any) -> torch.Tensor:
        return super().forward(batch) * self.scale


def fit(folder: Path | None, save_async: bool, load_path: str | None = None) -> Losses:
    """OddModel under FSDP2 on this process's rank, 8 batches, a ``full`` save every 2."""
    return two_rank_run(folder, "full", save_async, load_path, model=OddModel)


@pytest.mark.world_size(2)
def test_async_full_save_gathers_off_the_loop_equal_to_sync_and_resumes(tmp_path: Path) -> None:
    from cadence import dist

    gathered: list[str] = []  # the thread each gather ran in, on this rank
    real_gather = async_save.gather_to_rank0

    def spy(*args: Any, **kwargs: Any) -> Any:
        gathered.append(threading.current_thread().name)
        return real_gather(*args, **kwargs)

    sync = fit(tmp_path / "sync", save_async=False)
    async_save.gather_to_rank0 = spy  # type: ignore[assignment]
    try:
        run = fit(tmp_path / "async", save_async=True)
    finally:
        async_save.gather_to_rank0 = real_gather  # type: ignore[assignment]
    assert run.losses == sync.losses  # saving in the background changed nothing
    # every save (batches 2, 4, 6, 8) gathered in the writer thread, on every rank
    assert len(gathered) == 4 and all(n.startswith("cadence-checkpoint") for n in gathered)
    if dist.get_global_rank() == 0:
        for batch in (2, 4, 6, 8):
            name = f"ep{(batch - 1) // 4}-ba{batch}-rank0.pt"
            assert verify_checkpoint(tmp_path / "async" / name)
            got, want = tensors(tmp_path / "async" / name), tensors(tmp_path / "sync" / name)
            assert got.keys() == want.keys()
            # model and Adam's moments of every parameter, the uneven and empty ones included
            for key in ("/model/scale", "/model/net.0.weight",
                        "/optimizers/0/state/scale/exp_avg",
                        "/optimizers/0/state/net.2.weight/exp_avg_sq"):
                assert key in want, sorted(want)
            for key in want:
                assert got[key].shape == want[key].shape, key
                assert torch.equal(got[key], want[key]), (name, key)
            # the rest too (keys, parameter groups, metadata, counters; clocks are wall time)
            full_got = load_full_state(tmp_path / "async" / name)
            full_want = load_full_state(tmp_path / "sync" / name)
            assert full_got.keys() == full_want.keys()
            assert ([o["param_groups"] for o in full_got["optimizers"].values()]
                    == [o["param_groups"] for o in full_want["optimizers"].values()])
            assert full_got["metadata"] == full_want["metadata"]
            assert ({k: v for k, v in full_got["timestamp"].items() if isinstance(v, int)}
                    == {k: v for k, v in full_want["timestamp"].items() if isinstance(v, int)})
    dist.barrier()
    resumed = fit(None, save_async=False, load_path=str(tmp_path / "async" / "ep0-ba2-rank0.pt"))
    assert resumed.losses == sync.losses[2:]  # bit for bit


def test_shards_that_do_not_tile_a_tensor_are_refused_naming_it() -> None:
    """The check the writer runs before any data moves: a gap (rows 3..4 of 5 missing) and a
    rank listing other tensors are both refused with the tensor's name."""
    shape, dtype = (5, 8), torch.float32
    path = ("optimizers", "0", "state", "net.0.weight", "exp_avg")
    _check_tiling([[(path, shape, dtype, 0, 3)], [(path, shape, dtype, 3, 2)]])  # fine
    _check_tiling([[(path, (1, 3), dtype, 0, 1)], [(path, (1, 3), dtype, 1, 0)]])  # empty
    with pytest.raises(RuntimeError, match="net.0.weight/exp_avg .*do not cover its rows"):
        _check_tiling([[(path, shape, dtype, 0, 3)], [(path, shape, dtype, 4, 1)]])
    with pytest.raises(RuntimeError, match="do not cover its rows"):  # a row twice
        _check_tiling([[(path, shape, dtype, 0, 3)], [(path, shape, dtype, 2, 3)]])
    with pytest.raises(RuntimeError, match="sharded checkpoint states differ"):
        _check_tiling([[(path, shape, dtype, 0, 3)], [(("model", "x"), shape, dtype, 3, 2)]])
