"""``Section``: the base of every typed settings section of a run (checkpoint, preemption,
eval, logging, ...), and the interval check they share.

A section is a dataclass beside the code that gives its settings meaning. Its field names
are the flat keys a run file and Composer's ``Trainer`` use (``save_folder``,
``eval_interval``), so one object serves YAML, Python and Composer's keyword arguments; it
checks itself when made (``__post_init__``), raising :class:`ConfigError` that names every
bad key. Field metadata says how a run file writes a field: ``{"run_file": False}`` for a
Python-only value (a callable, an object store), ``{"python_type": T}`` where Python takes
more than the run file's type (``save_interval`` also takes a callable or a ``Time``).

Standard library (and :mod:`cadence.core.time`) only: the run-file check reads sections
before ``import torch``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

from cadence.registry.errors import ConfigError, ConfigProblem
from cadence.core.time import Time, TimeUnit

__all__ = ["Section", "interval_problem", "section_problems", "time_problem"]


class Section:
    """Mixin of a settings dataclass: ``normalize()`` then ``problems()`` run when it is
    made, and any problem raises :class:`ConfigError` (a ``ValueError``) naming its key."""

    def __post_init__(self) -> None:
        self.normalize()
        problems = self.problems()
        if problems:
            raise ConfigError(problems, f"{type(self).__name__}")

    def normalize(self) -> None:
        """Turn accepted spellings into the canonical value (in place); default: none."""

    def problems(self) -> list[ConfigProblem]:
        """Every problem with this section's values, each naming its flat key."""
        return []

    @classmethod
    def run_file_fields(cls) -> list[dataclasses.Field]:
        """The fields a run file may set (not the Python-only ones)."""
        return [f for f in dataclasses.fields(cls) if f.metadata.get("run_file", True)]


def section_problems(cls: type, values: Mapping[str, Any]) -> tuple[Optional[Any],
                                                                      list[ConfigProblem]]:
    """``(cls(**values), [])``, or ``(None, problems)`` when ``cls`` refuses them."""
    try:
        return cls(**values), []
    except ConfigError as exc:
        return None, list(exc.problems)


def interval_problem(key: str, time: Time) -> Optional[str]:
    """What is wrong with interval ``key`` (``save_interval``, ``eval_interval``,
    ``log_interval``) set to ``time``, or ``None``: a negative interval (and a zero
    ``log_interval``) would never fire, silently (``save_interval: -5ba`` used to leave only
    the final checkpoint). ``0`` means "only when training ends" for ``save_interval`` and
    ``eval_interval``."""
    if time.value < 0 or (key == "log_interval" and time.value == 0):
        off = ("save_interval: null turns checkpoints off" if key == "save_interval" else
               "an interval as long as max_duration runs it only at the end")
        return (f"{str(time)!r} is {'negative' if time.value < 0 else 'zero'}; {key} must be "
                f"a positive Time such as '1ep' or '500ba' ({off}).")
    return None


def time_problem(key: str, value: Any, default_unit: TimeUnit,
                 allow_callable: bool = False) -> Optional[ConfigProblem]:
    """The problem with Time-valued setting ``key`` (``None`` passes, and a callable where
    ``allow_callable``): a string that does not parse (the parser's message), another value
    that is not a Time, or an interval (a key ending in ``interval``) that is negative or
    zero (:func:`interval_problem`). An int takes ``default_unit``."""
    if value is None or (allow_callable and callable(value)):
        return None
    try:
        time = Time.from_input(value, default_unit)
    except (TypeError, ValueError) as exc:
        if isinstance(value, str):  # the parser's message names the string and the units
            return ConfigProblem(key, str(exc))
        what = "a Time (e.g. '1ep', '500ba')" + (
            " or a callable (state, event) -> bool" if allow_callable else "")
        return ConfigProblem(key, f"{value!r} is not {what}: {exc}")
    message = interval_problem(key, time) if key.endswith("interval") else None
    return None if message is None else ConfigProblem(key, message)
