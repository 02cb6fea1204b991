"""The :class:`NaNMonitor` callback: stop a run as soon as its training loss is NaN or inf.

Source: MosaicML Composer's ``NaNMonitor`` (``composer/callbacks/nan_monitor.py``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from cadence.core import Callback
from cadence.utils.dist import all_reduce, get_world_size
from cadence.registry import callbacks

if TYPE_CHECKING:
    from cadence.core import State

__all__ = ["NaNMonitor"]


@callbacks.register("nan_monitor")
class NaNMonitor(Callback):
    """Raises :class:`RuntimeError` at ``AFTER_TRAIN_BATCH`` when the batch's loss
    (``state.total_loss``) is NaN or infinite, before the optimizer steps on it.

    The error names the batch: the optimizer step it would have completed (1-based, the
    ``step`` its metrics would be logged at), its epoch and its place in the epoch (both
    1-based, as the console shows them), and the loss value.

    Cost: checking reads the loss on the host, a device synchronisation on every checked
    batch (``check_interval`` trades detection delay for fewer syncs). In a run of several
    ranks the loss is also all-reduced (summed) first, so every rank sees a NaN on any rank
    and all of them raise together instead of the others waiting forever in the next
    collective: one small all-reduce per checked batch. Every rank must run this callback.

    Args:
        check_interval: check every this many batches (default 1: every batch).

    Raises:
        ValueError: ``check_interval`` is not an integer >= 1.
    """

    def __init__(self, check_interval: int = 1) -> None:
        if isinstance(check_interval, bool) or int(check_interval) != check_interval \
                or check_interval < 1:
            raise ValueError(
                f"NaNMonitor check_interval must be an integer >= 1, got {check_interval!r}."
            )
        self.check_interval = int(check_interval)

    def after_train_batch(self, state: State, logger: Any) -> None:
        del logger
        step = int(state.timestamp.batch) + 1  # the step this batch completes
        if state.total_loss is None or step % self.check_interval != 0:
            return
        loss = state.total_loss.detach().float().sum()  # a new 0-d tensor
        world_size = get_world_size()
        if world_size > 1:
            all_reduce(loss, "sum")
        value = loss.item()  # host sync
        if math.isfinite(value):
            return
        timestamp = state.timestamp
        where = (f"batch {step} (epoch {int(timestamp.epoch) + 1}, batch "
                 f"{int(timestamp.batch_in_epoch) + 1} of the epoch)")
        if world_size > 1:
            local = state.total_loss.detach().float().sum().item()
            detail = f"the loss summed over {world_size} ranks is {value}; this rank's is {local}"
        else:
            detail = f"the loss is {value}"
        raise RuntimeError(
            f"NaNMonitor: training loss is not finite at {where}: {detail}. Stopping before the "
            f"optimizer step. Common causes: a learning rate that is too high, fp16 overflow "
            f"(try amp_bf16), or bad data in this batch."
        )
