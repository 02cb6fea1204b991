"""What the experiment-tracker destinations share (:class:`~cadence.loggers.WandBLogger`,
:class:`~cadence.loggers.MLFlowLogger`, :class:`~cadence.loggers.TensorboardLogger`): an
optional package checked without importing it, rank-zero-only logging, a run (or writer)
started at ``AFTER_LOAD`` (or ``FIT_START`` for a destination added later), once the run knows
whether it resumes a checkpoint, and hyperparameters flattened for tools whose parameters are
flat.

One training run is one tracker run: a destination whose run has an id (W&B, MLflow) keeps
it in every checkpoint (:class:`TrackerRunState`, a callback added to ``state.callbacks`` at
``INIT``), and a run that resumes a checkpoint of the same ``run_name`` continues that tracker
run instead of starting another.

Source: the shared shape of MosaicML Composer's ``WandBLogger``, ``MLFlowLogger`` and
``TensorboardLogger`` (``composer/loggers/``): ``rank_zero_only``, per-rank run names.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Optional

from cadence.core.callback import Callback
from cadence.loggers.file_logger import jsonable
from cadence.loggers.logger_destination import LoggerDestination
from cadence.utils import dist
from cadence.utils.dist import get_global_rank, get_world_size

if TYPE_CHECKING:
    from cadence.core.state import State

__all__ = ["TrackerDestination", "TrackerRunState", "flatten_hyperparameters", "installed",
           "resume_step"]


def installed(package: str) -> bool:
    """Whether ``import package`` can work, without importing it (``wandb`` takes ~0.5 s).

    Args:
        package: the top-level import name.

    Returns:
        False when the package is not found, or when ``sys.modules`` blocks it (``None``).
    """
    if package in sys.modules:  # imported already, or blocked (None)
        return sys.modules[package] is not None
    return importlib.util.find_spec(package) is not None


def flatten_hyperparameters(hyperparameters: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested hyperparameters as one level of dotted keys, values as JSON scalars.

    ``{"optimizer": {"name": "adamw", "lr": 1e-3}}`` becomes
    ``{"optimizer.name": "adamw", "optimizer.lr": 0.001}``; lists become their JSON text
    (``"[0.9, 0.95]"``), ``None`` the string ``"None"``; tensors are read (see
    :func:`~cadence.loggers.file_logger.jsonable`). For tools whose parameters are
    flat (TensorBoard's hparams plugin, MLflow params).

    Args:
        hyperparameters: the (nested) hyperparameters.
        prefix: prepended to every key (used for the nested levels).

    Returns:
        The flat ``{dotted key: scalar}`` dict.
    """
    flat: dict[str, Any] = {}
    for key, value in jsonable(dict(hyperparameters)).items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_hyperparameters(value, prefix=f"{name}."))
        elif isinstance(value, list):
            flat[name] = json.dumps(value)
        elif value is None:
            flat[name] = "None"
        else:
            flat[name] = value
    return flat


def resume_step(state: State) -> int:
    """The optimizer step a run starts from: the loaded checkpoint's batch, 0 for a new run.

    Read at ``AFTER_LOAD``; steps above it are (re)trained by this process, so a tracker
    overwrites or marks what an earlier attempt logged there.
    """
    return int(state.timestamp.batch)


class TrackerRunState(Callback):
    """A tracker run's identity in the run's checkpoints: ``{"logger", "run_name", "run_id"}``.

    A :class:`TrackerDestination` is not one of ``state.callbacks`` (whose state checkpoints
    keep), so a destination that has a run id adds one of these at ``INIT``; it dispatches no
    event. The keys are fixed and the values strings, so a sharded (DCP) checkpoint loads
    them into the same template it saved.

    Args:
        destination: the destination whose run id it keeps.
    """

    def __init__(self, destination: TrackerDestination) -> None:
        self.destination = destination

    def state_dict(self) -> dict[str, Any]:
        destination = self.destination
        return {"logger": type(destination).__name__,
                "run_name": destination._cadence_run_name or "",
                "run_id": destination.run_id_to_resume() or destination._shared_run_id or ""}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("logger") != type(self.destination).__name__:
            return  # another destination's (the run's loggers changed)
        run_name, run_id = state.get("run_name"), state.get("run_id")
        if run_id and run_name == self.destination._cadence_run_name:
            self.destination._resume_id = str(run_id)  # the same run: continue its tracker run


class TrackerDestination(LoggerDestination):
    """Base of the destinations that write to an experiment tracker.

    A subclass names its optional ``package`` (the import name, also its pip name and
    cadence's extra, and the logger's registered name) and implements :meth:`_start`, which
    opens the tracker's run or writer; ``AFTER_LOAD`` and ``FIT_START`` call it, and so does
    the first ``log_*`` or ``close`` call after ``INIT`` when neither came (it must return at
    once when already started, closed, or on a rank that does not log): subclasses call
    :meth:`_start_after_init` first in those methods. Before it,
    :attr:`resume_id` holds the run id a resumed checkpoint kept (``None`` for a new run) and
    :attr:`resumed_at` the step the run starts from (0 for a new run).

    A subclass whose runs have ids sets :attr:`keeps_run_id` and implements
    :meth:`run_id_to_resume`; the id is then saved in checkpoints (:class:`TrackerRunState`).

    Args:
        rank_zero_only: log on global rank zero only; else every rank logs on its own.

    Raises:
        ImportError: ``package`` is not installed (checked without importing it); the
            message names ``pip install <package>``.
    """

    #: The optional package this tracker needs (import name = pip name = extra).
    package: ClassVar[str] = ""
    #: Whether the tracker's run has an id that checkpoints keep (W&B, MLflow).
    keeps_run_id: ClassVar[bool] = False

    def __init__(self, rank_zero_only: bool = True) -> None:
        if not installed(self.package):  # fail before the run starts
            raise self.missing_package()
        self.rank_zero_only = rank_zero_only
        self._cadence_run_name: Optional[str] = None
        self._resume_id: Optional[str] = None
        self._init_state: Optional[State] = None  # INIT fired, the run not started yet
        self._shared_run_id: Optional[str] = None  # rank zero's run id, on the other ranks
        self._run_id_shared = False
        self.resumed_at = 0

    @property
    def resume_id(self) -> Optional[str]:
        """The tracker run id the loaded checkpoint kept for this run, or ``None``."""
        return self._resume_id

    def _start_after_init(self) -> None:
        """Start the run now if ``INIT`` fired and it has not started (a destination driven
        without ``AFTER_LOAD``: logging, or closing, after ``INIT`` starts it)."""
        state, self._init_state = self._init_state, None
        if state is not None:
            self._start(state)

    def run_id_to_resume(self) -> Optional[str]:
        """The id of this destination's tracker run (kept in checkpoints), once known."""
        return None

    @classmethod
    def missing_package(cls) -> ImportError:
        """The error that says how to install :attr:`package` (raise it).

        Returns:
            An ImportError naming ``pip install <package>`` and cadence's extra.
        """
        name = cls.package
        return ImportError(
            f"{cls.__name__} needs the `{name}` package, which is not installed. Install it "
            f"with `pip install {name}` (or `pip install 'cadence[{name}]'`), or remove the "
            f"{name} logger from the run's loggers."
        )

    def import_package(self) -> Any:
        """Import :attr:`package` (when the run starts).

        Returns:
            The imported module.

        Raises:
            ImportError: it cannot be imported; the message says how to install it.
        """
        try:
            return importlib.import_module(self.package)
        except ImportError as exc:
            raise self.missing_package() from exc

    def _enabled(self) -> bool:
        """Whether this rank logs (every rank, or global rank zero with ``rank_zero_only``)."""
        return not self.rank_zero_only or get_global_rank() == 0

    def _per_rank(self) -> bool:
        """Whether each rank logs into a run (or folder) of its own: several ranks, and not
        ``rank_zero_only``; the run name then ends with ``-rank<r>``."""
        return not self.rank_zero_only and get_world_size() > 1

    def _rank_name(self, name: str) -> str:
        """``name``, with ``-rank<r>`` appended when each rank has a run of its own."""
        return f"{name}-rank{get_global_rank()}" if self._per_rank() else name

    def _start(self, state: State) -> None:
        """Open the tracker's run or writer (a no-op once started, after close, or on a rank
        that does not log)."""
        raise NotImplementedError

    # -- events ---------------------------------------------------------------------------
    def init(self, state: State, logger: Any) -> None:
        del logger
        self._cadence_run_name = state.run_name
        self._init_state = state
        if self.keeps_run_id and not any(isinstance(c, TrackerRunState) and c.destination is self
                                          for c in state.callbacks):
            state.callbacks.append(TrackerRunState(self))  # its run id goes into checkpoints

    def after_load(self, state: State, logger: Any) -> None:
        del logger
        self.resumed_at = resume_step(state)
        self._init_state = None
        self._start(state)
        self._share_run_id()

    def _share_run_id(self) -> None:
        """Give every rank rank zero's run id (a collective: ``AFTER_LOAD`` and ``FIT_START``
        fire on every rank; once), so whichever rank's copy a sharded checkpoint keeps names
        it."""
        if self._run_id_shared:
            return
        self._run_id_shared = True
        if self.keeps_run_id and self.rank_zero_only and dist.is_initialized() \
                and get_world_size() > 1:
            shared = [self.run_id_to_resume()]
            dist.broadcast_object_list(shared, src=0)
            self._shared_run_id = shared[0]

    def fit_start(self, state: State, logger: Any) -> None:
        del logger
        if self._cadence_run_name is None:  # a destination added after INIT
            self._cadence_run_name = state.run_name
            self.resumed_at = resume_step(state)
        self._init_state = None
        self._start(state)
        self._share_run_id()
