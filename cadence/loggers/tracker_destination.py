"""What the experiment-tracker destinations share (:class:`~cadence.loggers.WandBLogger`,
:class:`~cadence.loggers.MLFlowLogger`, :class:`~cadence.loggers.TensorboardLogger`): an
optional package checked without importing it, rank-zero-only logging, a run (or writer)
started at ``INIT`` (or ``FIT_START`` for a destination added later), and hyperparameters
flattened for tools whose parameters are flat.

Source: the shared shape of MosaicML Composer's ``WandBLogger``, ``MLFlowLogger`` and
``TensorboardLogger`` (``composer/loggers/``): ``rank_zero_only``, per-rank run names.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

from cadence.loggers.file_logger import jsonable
from cadence.loggers.logger_destination import LoggerDestination
from cadence.utils.dist import get_global_rank, get_world_size

if TYPE_CHECKING:
    from cadence.core.state import State

__all__ = ["TrackerDestination", "flatten_hyperparameters", "installed"]


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


class TrackerDestination(LoggerDestination):
    """Base of the destinations that write to an experiment tracker.

    A subclass names its optional ``package`` (the import name, also its pip name and
    cadence's extra, and the logger's registered name) and implements :meth:`_start`, which
    opens the tracker's run or writer; ``INIT`` and ``FIT_START`` call it (it must return
    at once when already started, closed, or on a rank that does not log).

    Args:
        rank_zero_only: log on global rank zero only; else every rank logs on its own.

    Raises:
        ImportError: ``package`` is not installed (checked without importing it); the
            message names ``pip install <package>``.
    """

    #: The optional package this tracker needs (import name = pip name = extra).
    package: ClassVar[str] = ""

    def __init__(self, rank_zero_only: bool = True) -> None:
        if not installed(self.package):  # fail before the run starts
            raise self.missing_package()
        self.rank_zero_only = rank_zero_only

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
        self._start(state)

    def fit_start(self, state: State, logger: Any) -> None:
        del logger
        self._start(state)  # a destination added after INIT
