"""Every rank takes the same stop decision at a batch boundary, even when the signal lands
on one rank while that boundary's all-reduce runs (found by ``benchmarks/recovery.py``: one
rank stopped to save while the other trained on, and both waited until
``preemption_timeout``)."""

from __future__ import annotations

import signal
from typing import Any

import pytest


@pytest.mark.world_size(2)
def test_a_signal_during_the_all_reduce_waits_for_the_next_boundary() -> None:
    import torch.distributed as torch_dist

    from cadence.trainer.preemption import Preemption, _cpu_group

    rank = torch_dist.get_rank()
    preemption = Preemption(["SIGTERM"], 90.0)
    preemption._group = _cpu_group()
    real_all_reduce = torch_dist.all_reduce
    fired = []

    def all_reduce(*args: Any, **kwargs: Any) -> Any:
        work = real_all_reduce(*args, **kwargs)
        if rank == 0 and not fired:  # rank 0's handler runs just after the collective
            fired.append(True)
            preemption._handle(signal.SIGTERM, None)
        return work

    torch_dist.all_reduce = all_reduce
    try:
        first = preemption.requested()  # rank 1 contributed 0, rank 0 its 0 from before
        torch_dist.barrier()
        if rank == 1:  # the launcher's copy of the signal reaches rank 1 later
            preemption._handle(signal.SIGTERM, None)
        second = preemption.requested()
    finally:
        torch_dist.all_reduce = real_all_reduce
        if preemption._watchdog is not None:
            preemption._watchdog.cancel()
    assert first is None  # neither rank stops here: rank 1 could not know
    assert second == signal.SIGTERM  # both stop at the next boundary
