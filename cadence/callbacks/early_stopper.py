"""Stop training when a metric has stopped improving: :class:`EarlyStopper`.

Source: MosaicML Composer's ``EarlyStopper`` (``composer/callbacks/early_stopper.py``).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any, Optional, Union


from cadence.callbacks.metric_watcher import (
    Comparison, MetricWatcher, lower_is_better, parse_comparison,
)
from cadence.registry import callbacks
from cadence.core.time import Time, Timestamp, TimeUnit

if TYPE_CHECKING:
    from cadence.core.state import State

__all__ = ["EarlyStopper"]

log = logging.getLogger(__name__)


@callbacks.register("early_stopper")
class EarlyStopper(MetricWatcher):
    """Stops training when a metric has stopped improving (sets ``state.stop_training``;
    the run ends after the current batch, and its eval and checkpoint events).

    When it checks: for an evaluator's metric, after each evaluation (``EVAL_AFTER_ALL``);
    for a training metric (``dataloader_label="train"``, the trainer's per-batch
    ``state.train_metrics``), at every ``BATCH_END`` when ``patience`` is in batches, else at
    every ``EPOCH_END``.

    A value improves on the best so far when ``comp(value, best)`` holds and it differs from
    the best by more than ``min_delta``; the first value checked is the first best.

    Args:
        monitor: the metric's name, as the model's ``get_metrics`` names it (e.g.
            ``LanguagePerplexity``; logged as ``metrics/<label>/<monitor>``).
        dataloader_label: the evaluator's label (default ``eval``), or ``train``.
        comp: ``"<"`` (lower is better) or ``">"`` (higher is better) (``"<="``, ``">="``
            and a callable ``(value, best) -> bool`` are accepted too). Default: ``"<"`` for
            names containing loss, error, perplexity or entropy (see :func:`lower_is_better`),
            else ``">"``.
        min_delta: the smallest change that counts as an improvement (in the metric's units).
        patience: how long the metric may go without improving. An ``int`` ``n``: stop at the
            ``n``-th check in a row without improvement (``1``: the first one). A time
            (``"1ep"``, ``"500ba"``, ``"0.1dur"``, any unit): stop at the first check made
            *more* than that long after the best value (Composer's rule; so with an evaluation
            each epoch, ``"1ep"`` stops at the second evaluation without improvement).
            Default ``"1ep"``.

    Raises:
        ValueError: a bad ``comp``, a negative ``min_delta``, a non-positive ``patience``;
            at ``FIT_START``, a label or metric the run does not have.

    Example::

        EarlyStopper("LanguagePerplexity", "eval", patience=3)  # 3 evals without improvement
    """

    def __init__(
        self,
        monitor: str,
        dataloader_label: str = "eval",
        comp: Union[str, Comparison, None] = None,
        min_delta: float = 0.0,
        patience: Union[int, str, Time] = "1ep",
    ) -> None:
        super().__init__(monitor, dataloader_label)
        default = "<" if lower_is_better(monitor) else ">"
        self.comp, self.comp_name = parse_comparison(comp, default, "EarlyStopper")
        if min_delta < 0:
            raise ValueError(f"EarlyStopper min_delta must be >= 0, got {min_delta!r}.")
        self.min_delta = float(min_delta)
        if isinstance(patience, int) and not isinstance(patience, bool):
            if patience < 1:
                raise ValueError(f"EarlyStopper patience must be >= 1 check, got {patience!r}.")
            self.patience: Union[int, Time] = patience
        else:
            patience_time = Time.from_input(patience)
            if patience_time.value <= 0:
                raise ValueError(f"EarlyStopper patience must be > 0, got {patience!r}.")
            self.patience = patience_time
        self.best: Optional[float] = None
        self.best_timestamp: Optional[Timestamp] = None
        self.checks_since_best = 0

    def _improves(self, value: float) -> bool:
        if self.best is None:
            return not math.isnan(value)
        return bool(self.comp(value, self.best)) and abs(value - self.best) > self.min_delta

    def _out_of_patience(self, state: State) -> bool:
        if isinstance(self.patience, int):
            return self.checks_since_best >= self.patience
        # With no best yet (only NaNs so far), count from the start of training.
        since = self.best_timestamp if self.best_timestamp is not None else Timestamp()
        patience = state.to_time(self.patience)
        waited = state.timestamp.get(patience.unit).value - since.get(patience.unit).value
        return waited > patience.value

    def _check(self, state: State) -> None:
        value = self._read(state)
        if value is None:
            return
        if self._improves(value):
            self.best, self.best_timestamp, self.checks_since_best = value, state.timestamp, 0
            return
        self.checks_since_best += 1
        if self._out_of_patience(state):
            state.stop_training = True
            since = int(self.best_timestamp.batch) if self.best_timestamp is not None else 0
            log.info(
                "EarlyStopper: %s = %s has not improved on %s (comp %s, min_delta %s) since batch "
                "%d; stopping at batch %d (patience %s).",
                self.key, value, self.best, self.comp_name, self.min_delta, since,
                int(state.timestamp.batch), self.patience,
            )

    def batch_end(self, state: State, logger: Any) -> None:
        del logger
        if self.watches_train and isinstance(self.patience, Time) \
                and self.patience.unit == TimeUnit.BATCH:
            self._check(state)

    def epoch_end(self, state: State, logger: Any) -> None:
        del logger
        if self.watches_train and not (isinstance(self.patience, Time)
                                       and self.patience.unit == TimeUnit.BATCH):
            self._check(state)

    def state_dict(self) -> dict[str, Any]:
        """The best value, when it was seen, and the checks since."""
        stamp = self.best_timestamp
        return {"best": self.best, "best_timestamp": None if stamp is None else stamp.state_dict(),
                "checks_since_best": self.checks_since_best}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        best = state.get("best")
        self.best = None if best is None else float(best)
        stamp = state.get("best_timestamp")
        self.best_timestamp = None if stamp is None else Timestamp.from_state_dict(stamp)
        self.checks_since_best = int(state.get("checks_since_best", 0))
