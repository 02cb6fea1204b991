"""The :class:`WandBLogger`: metrics and hyperparameters to Weights & Biases.

Source: MosaicML Composer's ``WandBLogger`` (``composer/loggers/wandb_logger.py``), trimmed
to metrics and hyperparameters. ``wandb`` is an optional dependency (``pip install wandb``),
imported only when the logger starts its run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from cadence.loggers.file_logger import jsonable
from cadence.loggers.logger_destination import to_python
from cadence.loggers.tracker_destination import TrackerDestination
from cadence.config.registry import loggers

if TYPE_CHECKING:
    from cadence.core.state import State

__all__ = ["WandBLogger"]

@loggers.register("wandb")
class WandBLogger(TrackerDestination):
    """Logs metrics (``run.log(metrics, step=step)``) and hyperparameters
    (``run.config.update``) to a Weights & Biases run.

    The run is started at ``AFTER_LOAD`` (``wandb.init``), so hyperparameters the Trainer
    logs then (its ``hyperparameters`` argument: e.g. the whole YAML config, and the seed)
    land in the run's config. Metric values may be 0-d tensors; they are read
    (:func:`~cadence.loggers.to_python`, a host sync) when written, not when logged.
    Anything logged before the run starts is kept and sent then. ``step`` is the
    optimizer step (``state.timestamp.batch``); W&B drops values logged at a step lower
    than one it has already seen.

    By default only global rank zero starts a run (one W&B run per training run). With
    ``rank_zero_only=False`` and several ranks, every rank starts its own run, named
    ``<name>-rank<r>`` and grouped under ``group`` (default: the run name).

    One training run is one W&B run: the run's id is kept in every checkpoint, and a run
    that resumes a checkpoint of the same ``run_name`` (autoresume) continues that W&B run
    (``wandb.init(id=<id>, resume="allow")``) instead of starting another. W&B keeps the
    first value logged at a step: after a hard kill, the steps the killed attempt logged
    past its last checkpoint keep that attempt's values (the ``file`` logger marks them).

    The run is finished (``run.finish()``) in :meth:`close`, which is safe to call twice.
    To log without a W&B account or network, set ``WANDB_MODE=offline`` (or pass
    ``init_kwargs={"mode": "offline"}``): the run is written under ``<dir>/wandb/offline-run-*``
    and can be uploaded later with ``wandb sync``.

    Args:
        project: the W&B project; default W&B's (``WANDB_PROJECT``, else ``uncategorized``).
        entity: the W&B team or user; default W&B's (``WANDB_ENTITY``, else your default).
        name: the W&B run's display name; default the run's ``run_name``.
        tags: tags for the W&B run.
        group: groups runs in the W&B UI (e.g. the ranks of one run, or a sweep).
        dir: the directory ``wandb/`` is written into; may contain ``{run_name}``. Default:
            the ``WANDB_DIR`` environment variable when set (as ``wandb.init`` and Composer's
            logger honour it, e.g. to put runs on scratch space), else the run's
            ``save_folder`` if it has one, else ``runs/{run_name}``. Created if missing.
        rank_zero_only: start a run on global rank zero only (default); else on every rank.
        init_kwargs: more keyword arguments for ``wandb.init`` (``mode``, ``notes``,
            ``settings``, ``reinit``, ...); they override the arguments above.

    Raises:
        ImportError: ``wandb`` is not installed (at construction, and when the run starts), naming
            ``pip install wandb``.
        ValueError: ``init_kwargs`` holds ``config`` (log it with ``log_hyperparameters``, or
            the Trainer's ``hyperparameters``, instead).

    Example::

        trainer = Trainer(..., loggers=[WandBLogger(project="gpt2-small", tags=["baseline"])])
    """

    package = "wandb"
    keeps_run_id = True

    def __init__(
        self,
        project: Optional[str] = None,
        entity: Optional[str] = None,
        name: Optional[str] = None,
        tags: Optional[Sequence[str]] = None,
        group: Optional[str] = None,
        dir: Optional[str] = None,  # noqa: A002 - the name wandb.init uses
        rank_zero_only: bool = True,
        init_kwargs: Optional[Mapping[str, Any]] = None,
    ) -> None:
        super().__init__(rank_zero_only)
        init_kwargs = dict(init_kwargs or {})
        if "config" in init_kwargs:
            raise ValueError(
                "WandBLogger(init_kwargs=...) must not hold 'config': pass the run's "
                "configuration as the Trainer's hyperparameters (or call "
                "logger.log_hyperparameters), which WandBLogger sends to wandb.config."
            )
        self.project = project
        self.entity = entity
        self.name = name
        self.tags = list(tags) if tags is not None else None
        self.group = group
        self.dir = dir
        self.init_kwargs = init_kwargs
        self._run: Any = None
        self._run_id: Optional[str] = None
        self._finished = False
        self._pending_config: dict[str, Any] = {}
        self._pending_metrics: list[tuple[dict[str, Any], Optional[int]]] = []

    # -- the W&B run ----------------------------------------------------------------------
    @property
    def run(self) -> Any:
        """The ``wandb`` run this logger writes to, or ``None`` (not started, finished, or a
        rank that does not log)."""
        return self._run

    def _init_kwargs(self, state: State) -> dict[str, Any]:
        run_name = state.run_name
        name = self._rank_name(self.name if self.name is not None else run_name)
        group = self.group
        if self._per_rank():
            group = group if group is not None else run_name
        if self.dir is not None:
            folder = self.dir.format(run_name=run_name)
        elif os.environ.get("WANDB_DIR"):
            folder = os.path.expanduser(os.environ["WANDB_DIR"])
        elif state.save_folder is not None:
            folder = str(state.save_folder)
        else:
            folder = f"runs/{run_name}"
        Path(folder).mkdir(parents=True, exist_ok=True)
        kwargs: dict[str, Any] = {
            "project": self.project, "entity": self.entity, "name": name, "tags": self.tags,
            "group": group, "dir": folder,
        }
        if self.resume_id is not None:  # the checkpoint's run: continue it
            kwargs.update(id=self.resume_id, resume="allow")
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        kwargs.update(self.init_kwargs)
        return kwargs

    def run_id_to_resume(self) -> Optional[str]:
        """The W&B run's id (kept in checkpoints), once the run started."""
        return self._run_id

    def _start(self, state: State) -> None:
        if self._run is not None or self._finished or not self._enabled():
            return
        wandb = self.import_package()
        self._run = wandb.init(config=self._pending_config or None, **self._init_kwargs(state))
        self._run_id = str(self._run.id)
        self._pending_config = {}
        pending, self._pending_metrics = self._pending_metrics, []
        for metrics, step in pending:
            self._log(metrics, step)

    def _log(self, metrics: dict[str, Any], step: Optional[int]) -> None:
        if step is None:
            self._run.log(metrics)
        else:
            self._run.log(metrics, step=step)

    # -- LoggerDestination ----------------------------------------------------------------
    def log_metrics(self, metrics: Mapping[str, Any], step: Optional[int] = None) -> None:
        """Send ``metrics`` to the run at ``step`` (tensors are read here)."""
        self._start_after_init()
        if not self._enabled() or self._finished or not metrics:
            return
        values = {str(key): to_python(value) for key, value in metrics.items()}
        if self._run is None:
            self._pending_metrics.append((values, step))
        else:
            self._log(values, step)

    def log_hyperparameters(self, hyperparameters: Mapping[str, Any]) -> None:
        """Merge ``hyperparameters`` into the run's config (``run.config.update``)."""
        self._start_after_init()
        if not self._enabled() or self._finished:
            return
        config = jsonable(dict(hyperparameters))
        if self._run is None:
            self._pending_config.update(config)
        else:
            self._run.config.update(config, allow_val_change=True)

    # -- events (AFTER_LOAD and FIT_START start the run: TrackerDestination) ---------------
    def close(self) -> None:
        """Finish the W&B run (``run.finish()``), flushing what was logged. Safe to call twice.

        Metrics logged but never sent (the run never started) are dropped.
        """
        self._start_after_init()
        self._pending_metrics = []
        self._pending_config = {}
        if self._run is not None:
            run, self._run = self._run, None
            self._finished = True
            run.finish()
