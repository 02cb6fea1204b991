"""The bottom of the package graph that the run file reads: what a component declares about
itself, next to the component, without importing anything above :mod:`cadence.core`.

- :mod:`~cadence.registry.registry`: name -> class (or builder) registries; a plug-in
  registers with ``from cadence.registry import callbacks`` and ``@callbacks.register(...)``;
- :mod:`~cadence.registry.targets`: what a dotted import path may resolve to per key;
- :mod:`~cadence.registry.arg_checks`: value checks a component declares for its arguments;
- :mod:`~cadence.registry.errors`: ``ConfigProblem`` / ``ConfigError`` and the one "did you
  mean", raised alike by the run file and by a config section built in Python;
- :mod:`~cadence.registry.section`: ``Section``, the base of every settings section (the
  checkpoint, preemption, run, eval and logging settings beside the code that uses them).

Standard library only; names are imported on first use (:mod:`cadence._lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cadence._lazy import lazy_exports

if TYPE_CHECKING:
    from cadence.registry.errors import ConfigError, ConfigProblem, did_you_mean
    from cadence.registry.registry import (
        Registry, algorithms, callbacks, datasets, import_object, loggers, models, optimizers,
        schedulers,
    )

__all__ = ["Registry", "models", "algorithms", "callbacks", "loggers", "datasets", "optimizers",
           "schedulers", "import_object", "ConfigError", "ConfigProblem", "did_you_mean"]

_registry, _errors = "cadence.registry.registry", "cadence.registry.errors"
__getattr__, __dir__ = lazy_exports(__name__, {
    "Registry": _registry, "models": _registry, "algorithms": _registry,
    "callbacks": _registry, "loggers": _registry, "datasets": _registry,
    "optimizers": _registry, "schedulers": _registry, "import_object": _registry,
    "ConfigError": _errors, "ConfigProblem": _errors, "did_you_mean": _errors,
})
