"""The :class:`LRMonitor` callback: logs each optimizer parameter group's learning rate.

Source: MosaicML Composer's ``LRMonitor`` (``composer/callbacks/lr_monitor.py``).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from cadence.core import Callback
from cadence.registry import callbacks

if TYPE_CHECKING:
    from cadence.core import State

__all__ = ["LRMonitor"]


@callbacks.register("lr_monitor")
class LRMonitor(Callback):
    """Logs ``lr-<OptimizerClassName>/group<i>`` for every parameter group at ``BATCH_END``.

    The value is the group's ``lr`` after the scheduler stepped, i.e. the learning rate the
    next batch uses (as in Composer). When two optimizers share a class, their keys carry
    the optimizer's index: ``lr-AdamW_0/group0``, ``lr-AdamW_1/group0``.

    Example::

        trainer = Trainer(..., callbacks=[LRMonitor()])  # logs lr-AdamW/group0 each batch
    """

    def batch_end(self, state: State, logger: Any) -> None:
        names = [type(optimizer).__name__ for optimizer in state.optimizers]
        counts = Counter(names)
        metrics: dict[str, Any] = {}
        for index, (optimizer, name) in enumerate(zip(state.optimizers, names)):
            prefix = f"lr-{name}" if counts[name] == 1 else f"lr-{name}_{index}"
            for group_index, group in enumerate(optimizer.param_groups):
                metrics[f"{prefix}/group{group_index}"] = group["lr"]
        if metrics:
            logger.log_metrics(metrics)
